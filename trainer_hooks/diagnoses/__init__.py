"""Diagnoses in plain words: detectors over the record stream (docs/DIAGNOSES.md).

Pure Python over protocol record dicts (no torch), run on the Monitor's background
thread. ``DiagnosisEngine.observe(record)`` returns the alert records to emit.

Example:
    >>> from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine
    >>> engine = DiagnosisEngine({"vanishing_factor": 1e-4})
    >>> engine.observe({"kind": "epoch", "epoch": 0, "step": 9, "t": 0.0})
    []
"""

from .engine import DETECTORS, DiagnosisEngine
from .thresholds import THRESHOLDS

__all__ = ["DETECTORS", "THRESHOLDS", "DiagnosisEngine"]
