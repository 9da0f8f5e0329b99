"""gradwatch's warning category, and warning once per kind of trouble.

Monitoring must never break training: trouble (server away, disk full, a batch the
server refuses) is reported as a :class:`GradwatchWarning`, once per kind, and the
run carries on. The category lives here, in the torch-free protocol package, so the
websocket sender and ``gradwatch.trainer_hooks`` raise the same one.

Example:
    >>> import warnings
    >>> once = WarnOnce()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     once.warn("offline", "server unreachable")
    ...     once.warn("offline", "server unreachable again")
    >>> len(caught)
    1
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings

logger = logging.getLogger("gradwatch")


class GradwatchWarning(UserWarning):
    """Something went wrong with monitoring; training itself is unaffected."""


class WarnOnce:
    """Emits at most one :class:`GradwatchWarning` per ``kind`` (thread-safe).

    Called from background threads, so a warning filter that turns warnings into
    errors (``-W error``) must not kill the thread: such an error is swallowed and
    the message still goes to the ``gradwatch`` logger.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def warn(self, kind: str, message: str) -> bool:
        """Warn about ``kind`` unless already warned; True when this call warned."""
        with self._lock:
            if kind in self._seen:
                return False
            self._seen.add(kind)
        logger.warning("%s", message)
        # "-W error" turns the warning into an exception: it must not kill the thread.
        with contextlib.suppress(Exception):
            warnings.warn(message, GradwatchWarning, stacklevel=3)
        return True

    def seen(self, kind: str) -> bool:
        with self._lock:
            return kind in self._seen
