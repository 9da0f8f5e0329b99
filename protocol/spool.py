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


def scan_spool(
    path: str | os.PathLike[str],
) -> tuple[list[tuple[int, dict[str, Any]]], list[str], bool]:
    """Every readable message of a spool with its line number, and what was not.

    Returns (``[(line, message), ...]``, problems as ``"path:line: why"``, whether the
    last line is torn). A UTF-8 byte-order mark at the start is accepted; a line that
    is not UTF-8, not JSON or not a message is named and skipped, so one bad line
    costs only itself. A torn last line (the process died mid-write) is reported too.
    Raises OSError when the file cannot be read.
    """
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
        torn_possible = False
    else:
        torn_possible = bool(lines)
    messages: list[tuple[int, dict[str, Any]]] = []
    problems: list[str] = []
    torn = False
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(f"{path}:{number}: expected UTF-8 text, got byte "
                            f"0x{raw[e.start]:02x} at column {e.start + 1}")
            continue
        try:
            message = loads(line)
        except ValueError as e:
            if number == len(lines) and torn_possible:
                torn = True
                problems.append(f"{path}:{number}: the last line is torn (no newline, "
                                f"incomplete JSON: the writer stopped mid-line)")
            else:
                problems.append(f"{path}:{number}: expected one JSON message per line: {e}")
            continue
        if not isinstance(message, dict) or "type" not in message:
            # what it got, shortened: the keys of an object without "type", else the value
            if isinstance(message, dict):
                keys = ", ".join(repr(k) for k in list(message)[:8]) or "no keys"
                got = f"an object without it (keys: {keys})"
            else:
                got = f"{type(message).__name__} {line.strip()[:80]}"
            problems.append(f"{path}:{number}: expected a JSON object with a 'type' field, "
                            f"got {got}")
            continue
        messages.append((number, message))
    return messages, problems, torn


def read_spool(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield each message of a spool file in order.

    A torn last line (the process died mid-write) is skipped: everything before it
    is intact. Any other bad line raises :class:`SpoolError` naming the line
    (:func:`scan_spool` reads past bad lines instead).
    """
    messages, problems, torn = scan_spool(path)
    if len(problems) > int(torn):
        raise SpoolError(problems[0])
    for _, message in messages:
        yield message
