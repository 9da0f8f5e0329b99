"""Process and device memory, on every step: ``rss_bytes``, ``cuda_*_bytes``.

RSS comes from ``/proc/self/statm`` (Linux; no psutil dependency); where that file
does not exist the field is left out. CUDA numbers are the caching allocator's own
counters (``torch.cuda.memory_allocated``/``memory_reserved``), host-side reads that
never synchronise, and appear only once CUDA has been initialised in this process.

Example:
    >>> q = Memory(); q.start_step(False)
    >>> q.encode(q.finish_step(None))["rss_bytes"] > 0
    True
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .base import Quantity

_STATM = "/proc/self/statm"


def rss_bytes() -> int | None:
    """Resident set size of this process in bytes, or None where unknown."""
    try:
        with open(_STATM, "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Memory(Quantity):
    """Fills ``rss_bytes`` and, on CUDA, ``cuda_allocated_bytes``/``cuda_reserved_bytes``."""

    name = "memory"
    heavy = False

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        rss = rss_bytes()
        if rss is not None:
            fields["rss_bytes"] = rss
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            fields["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated())
            fields["cuda_reserved_bytes"] = int(torch.cuda.memory_reserved())
        return fields
