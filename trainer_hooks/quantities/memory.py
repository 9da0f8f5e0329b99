"""Process and device memory of every step: ``rss_bytes``, ``cuda_*_bytes``.

Read on the background thread when it finishes a step record (so within a few tens
of milliseconds of the step, later when the thread lags), never on the training
thread. RSS comes from ``/proc/self/statm`` (Linux; no psutil dependency); where that
file does not exist the field is left out. CUDA numbers are the caching allocator's
own counters (``torch.cuda.memory_allocated``/``memory_reserved``), host-side reads
that never synchronise, and appear only once CUDA has been initialised.

Example:
    >>> memory_fields()["rss_bytes"] > 0
    True
"""

from __future__ import annotations

import os
from typing import Any

import torch

_STATM = "/proc/self/statm"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_fd: int | None = None
_fd_pid: int | None = None


def rss_bytes() -> int | None:
    """Resident set size of this process in bytes, or None where unknown.

    The file stays open (re-read with ``pread``): opening it costs ~80 µs on a busy
    box, a re-read ~5 µs. A forked child opens its own.
    """
    global _fd, _fd_pid
    try:
        if _fd is None or _fd_pid != os.getpid():
            _fd, _fd_pid = os.open(_STATM, os.O_RDONLY), os.getpid()
        return int(os.pread(_fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def memory_fields() -> dict[str, Any]:
    """``rss_bytes`` and, once CUDA is initialised, ``cuda_allocated/reserved_bytes``."""
    fields: dict[str, Any] = {}
    rss = rss_bytes()
    if rss is not None:
        fields["rss_bytes"] = rss
    # is_initialized() alone: CUDA initialised is CUDA available, and is_available()
    # is cold code in a training loop (this function took 48 µs a call with it, 43
    # without, on the background thread of bench/workloads.py's long_lstm)
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        fields["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated())
        fields["cuda_reserved_bytes"] = int(torch.cuda.memory_reserved())
    return fields
