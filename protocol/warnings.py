"""gradwatch's warning category, and warning once per kind of trouble.

Monitoring must never break training: trouble (server away, disk full, a batch the
server refuses) is reported as a :class:`GradwatchWarning`, once per kind, and the
run carries on. The category lives here, in the torch-free protocol package, so the
websocket sender and ``gradwatch.trainer_hooks`` raise the same one. What is not
trouble (the run's link, a close that waits for the server) is one line on stderr
(:func:`say`).

Example:
    >>> import warnings
    >>> once = WarnOnce()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     first = once.warn("offline", "server unreachable")
    ...     again = once.warn("offline", "server unreachable again")
    >>> first, again, len(caught)
    (True, False, 1)
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
import weakref
from pathlib import Path
from types import FrameType

logger = logging.getLogger("gradwatch")


class GradwatchWarning(UserWarning):
    """Something went wrong with monitoring; training itself is unaffected."""


# gradwatch's own folders (the package's parts): frames in them are not the user's line
_OURS = tuple(
    str(Path(__file__).resolve().parents[1] / part) + os.sep
    for part in ("protocol", "trainer_hooks", "server", "integrations", "notebook")
)
# threading: a background thread's frames; weakref: a finalizer's (a dropped monitor)
_NOT_USER = (*_OURS, *(str(Path(m.__file__).resolve()) for m in (threading, weakref) if m.__file__))


def user_location() -> tuple[str, int, str] | None:
    """(file, line, module) of the innermost frame outside gradwatch, threading and weakref."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        try:
            resolved = str(Path(name).resolve())
        except OSError:
            resolved = name
        if not resolved.startswith(_NOT_USER) and not name.startswith("<frozen"):
            return name, frame.f_lineno, str(frame.f_globals.get("__name__", "__main__"))
        frame = frame.f_back
    return None


def say(line: str) -> None:
    """One line to stderr in one write: print() writes the text and its newline apart,
    so a line from the sender thread and one from the training thread could join."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class WarnOnce:
    """Emits at most one :class:`GradwatchWarning` per ``kind`` (thread-safe).

    Called from background threads, so a warning filter that turns warnings into
    errors (``-W error``) must not kill the thread: such an error is swallowed and
    the message goes to the ``gradwatch`` logger instead.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        # where the user started monitoring: what a background thread's warning points at
        self.origin = user_location()

    def warn(self, kind: str, message: str) -> bool:
        """Warn about ``kind`` unless already warned; True when this call warned."""
        with self._lock:
            if kind in self._seen:
                return False
            self._seen.add(kind)
        # the user's line: the caller outside gradwatch on this thread, else (a
        # background thread) the line that started monitoring; never threading.py
        where = user_location() or self.origin
        try:
            if where is None:
                warnings.warn(message, GradwatchWarning, stacklevel=3)
            else:
                filename, lineno, module = where
                warnings.warn_explicit(message, GradwatchWarning, filename, lineno, module)
        except Exception:
            # "-W error" turns the warning into an exception: it must not kill a
            # background thread. The message still goes somewhere: the log.
            logger.warning("%s", message)
        return True

    def seen(self, kind: str) -> bool:
        with self._lock:
            return kind in self._seen
