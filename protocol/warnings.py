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
    ...     first = once.warn("offline", "server unreachable")
    ...     again = once.warn("offline", "server unreachable again")
    >>> first, again, len(caught)
    (True, False, 1)
"""

from __future__ import annotations

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
    the message goes to the ``gradwatch`` logger instead.
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
        try:
            warnings.warn(message, GradwatchWarning, stacklevel=3)
        except Exception:
            # "-W error" turns the warning into an exception: it must not kill a
            # background thread. The message still goes somewhere: the log.
            logger.warning("%s", message)
        return True

    def seen(self, kind: str) -> bool:
        with self._lock:
            return kind in self._seen
