"""The `vanishing` detector (being written: judges nothing yet)."""

from __future__ import annotations

from .base import Detector


class VanishingDetector(Detector):
    code = "vanishing"
