"""The `nonfinite` detector (being written: judges nothing yet)."""

from __future__ import annotations

from .base import Detector


class NonfiniteDetector(Detector):
    code = "nonfinite"
