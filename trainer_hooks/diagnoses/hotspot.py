"""The `hotspot` detector (being written: judges nothing yet)."""

from __future__ import annotations

from .base import Detector


class HotspotDetector(Detector):
    code = "hotspot"
