"""The `graph_growth` detector (being written: judges nothing yet)."""

from __future__ import annotations

from .base import Detector


class GraphGrowthDetector(Detector):
    code = "graph_growth"
