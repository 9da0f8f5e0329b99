"""The undelivered spool of an earlier process, found and sent by the next one.

A trainer restarted with the same run id and spool path finds the spool its
predecessor left (the server was away when it ended). The new sender writes its own
spool beside it (``spoolfiles.fresh_path``) and hands the old ones to a background
thread that uploads them exactly like ``gradwatch upload`` (idempotent: the server
stores each ``(run_id, rank, session, seq)`` once) and removes each once every
batch in it is acknowledged. A spool that another live process still writes is
held under an advisory lock (``lock_spool``) and left alone. What cannot be sent is
left where it is, with one warning that names the exact command.

Example:
    >>> from pathlib import Path
    >>> leftovers(Path("/nonexistent/run.jsonl"), Path("/nonexistent/run-2.jsonl"))
    []
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

from .spoolfiles import upload_command
from .warnings import WarnOnce

if sys.platform != "win32":
    import fcntl


def lock_spool(handle: BinaryIO) -> None:
    """Mark the spool open in ``handle`` as this live process's (advisory, shared)."""
    if sys.platform != "win32":  # Windows: no lock, no live-process check
        with contextlib.suppress(OSError):
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)


def _in_use(path: Path) -> bool:
    """Whether a live process holds ``path`` open as its spool."""
    if sys.platform == "win32":
        return False
    try:
        with open(path, "rb") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    except OSError:
        return True
    return False


def leftovers(chosen: Path, own: Path) -> list[Path]:
    """Non-empty spools at ``chosen`` and its ``-2``, ``-3``... siblings, not ``own``."""
    stem = chosen.name[: -len(".jsonl")] if chosen.name.endswith(".jsonl") else chosen.name
    found: list[Path] = []
    candidates = [chosen] + [chosen.with_name(f"{stem}-{n}.jsonl") for n in range(2, 100)]
    for path in candidates:
        if path == own:
            continue
        try:
            if path.stat().st_size > 0:
                found.append(path)
        except OSError:
            if path != chosen:
                break  # the siblings are numbered without gaps (fresh_path)
    return found


def resend_in_background(
    paths: list[Path], url: str, token: str | None, warn: WarnOnce, timeout: float = 120.0
) -> threading.Thread | None:
    """Start a daemon thread that uploads each of ``paths``; None when there are none."""
    if not paths:
        return None
    thread = threading.Thread(
        target=_resend, args=(paths, url, token, warn, timeout),
        name="gradwatch-leftovers", daemon=True,
    )
    thread.start()
    return thread


def _resend(paths: list[Path], url: str, token: str | None, warn: WarnOnce,
            timeout: float) -> None:
    from .upload import upload  # imports websockets' client; only needed here

    for path in paths:
        if _in_use(path):
            continue
        command = upload_command(path, url, token is not None)
        try:
            result: Any = upload(path, url, token, timeout=timeout)
        except Exception as e:
            warn.warn(f"leftover:{path}", f"gradwatch: found the undelivered spool {path} of an "
                      f"earlier process and could not send it ({e}); send it with: {command}")
            continue
        if result.rejected or result.acked < result.batches or result.skipped_lines:
            warn.warn(f"leftover:{path}", f"gradwatch: the undelivered spool {path} of an "
                      f"earlier process was sent in part ({result.acked} of {result.batches} "
                      f"batches acknowledged); it is kept; see: {command}")
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)
