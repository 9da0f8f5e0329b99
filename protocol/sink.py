"""Where encoded records go: a spool file, or a server over a websocket.

A sink is called only from gradwatch's background thread, never from the training
loop. ``send`` takes one batch of records and must not raise: trouble is warned
about once and the records are kept (in memory within a bound, then on disk).

Example:
    >>> import tempfile, os
    >>> from gradwatch.protocol.spool import read_spool
    >>> path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
    >>> sink = SpoolSink(path, hello={"type": "hello", "protocol": 1, "run_id": "r", "rank": 0})
    >>> sink.send([{"kind": "step", "step": 0}])
    >>> sink.close()
    >>> [m["type"] for m in read_spool(path)]
    ['hello', 'batch']
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Protocol

from .spool import SpoolWriter


class Sink(Protocol):
    """What the background thread hands batches to.

    A sink may also have a ``viewed`` attribute: False while nobody can be watching
    the run live, which lets the background thread hand records over less often
    (``trainer_hooks/pipeline.py``); a sink without it is taken as viewed.
    """

    def send(self, records: list[dict[str, Any]]) -> None:
        """Take one batch of records; never raises, never blocks for long."""

    def close(self, timeout: float | None = None) -> None:
        """Deliver or persist what is pending, waiting at most ``timeout`` seconds."""


def with_session(hello: dict[str, Any]) -> dict[str, Any]:
    """The hello with a ``session`` of its own, drawn now unless it already has one.

    ``seq`` counts from 0 in every trainer process; a resumed process of the same run
    and rank would repeat the seqs of the one before it. The server deduplicates on
    ``(run_id, rank, session, seq)``, so one session per sender keeps the two apart,
    while a spool replayed twice keeps its session and is still stored once.
    """
    if hello.get("session"):
        return hello
    return {**hello, "session": str(uuid.uuid4())}


class SpoolSink:
    """Writes the hello, then one ``batch`` message per ``send``, to a JSON Lines file.

    The file is exactly what the websocket would have carried, so ``gradwatch
    upload`` can send it later and the server stores it once, whatever the retries.
    Nobody watches a spool file live, so it is never ``viewed``.
    """

    viewed = False

    def __init__(self, path: str | os.PathLike[str], hello: dict[str, Any]) -> None:
        self.path = path
        self.hello = with_session(hello)
        self._writer = SpoolWriter(path)
        self._writer.write(self.hello)
        self._seq = 0

    def send(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        self._writer.write(
            {
                "type": "batch",
                "run_id": self.hello["run_id"],
                "rank": self.hello["rank"],
                "seq": self._seq,
                "records": records,
            }
        )
        self._seq += 1
        self._writer.flush()

    def close(self, timeout: float | None = None) -> None:
        self._writer.close()
