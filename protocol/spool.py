"""Spool files: JSON Lines of protocol messages, one message per line.

A spool is what ``watch(model, server=None, spool="run.jsonl")`` writes, what the
sender falls back to while the server is away, and what ``gradwatch upload`` sends
later. Each line is one complete message (``hello`` or ``batch``) exactly as it
would travel on the websocket, so replaying a spool is replaying the wire.

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
    >>> with SpoolWriter(path) as w:
    ...     w.write({"type": "hello", "protocol": 1})
    >>> [m["type"] for m in read_spool(path)]
    ['hello']
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from .codec import dumps, loads


class SpoolError(ValueError):
    """A spool line that is not a protocol message; says which line and why."""


class SpoolWriter:
    """Appends messages to a JSON Lines file; ``flush()`` makes them durable."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, message: dict[str, Any]) -> None:
        if self._file is None:
            raise ValueError(f"spool {self.path} is closed")
        self._file.write(dumps(message) + "\n")

    def flush(self, fsync: bool = False) -> None:
        if self._file is None:
            return
        self._file.flush()
        if fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_spool(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield each message of a spool file in order.

    A torn last line (the process died mid-write) is skipped: everything before it
    is intact. Any other bad line raises :class:`SpoolError` naming the line.
    """
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            message = loads(line)
        except ValueError as e:
            if number == len(lines) and not line.endswith("\n"):
                return
            raise SpoolError(f"{path}:{number}: expected one JSON message per line: {e}") from e
        if not isinstance(message, dict) or "type" not in message:
            # what it got, shortened: the keys of an object without "type", else the value
            if isinstance(message, dict):
                keys = ", ".join(repr(k) for k in list(message)[:8]) or "no keys"
                got = f"an object without it (keys: {keys})"
            else:
                got = f"{type(message).__name__} {line.strip()[:80]}"
            raise SpoolError(
                f"{path}:{number}: expected a JSON object with a 'type' field, got {got}"
            )
        yield message
