"""``gradwatch upload SPOOL``: send a spool file to a server, idempotently.

A spool holds ``hello`` then ``batch`` messages (possibly several runs or ranks, each
starting with its own ``hello``), exactly as they would have travelled. Upload replays
each part on its own connection with the original ``seq`` numbers, several batches in
flight, and waits for every ``ack``. The server stores each ``(run_id, rank, seq)``
once, so uploading the same file twice, or a file whose batches partly reached the
server already, stores everything exactly once.

A batch the server refuses for good (``error`` with 1007/1009) is set aside in
``<spool>.rejected.jsonl`` and the rest goes on; a refused connection (1008: token,
protocol) or an unreachable server ends the upload with :class:`UploadError`. A line
that cannot be read (not UTF-8, not JSON, torn at the end, a batch of another run
than its hello's) is skipped, named by its line number in ``skipped_lines``, and
every intact batch still goes; a UTF-8 byte-order mark is accepted.

Example:
    >>> result = upload("run.jsonl", "ws://127.0.0.1:8765")   # doctest: +SKIP
    >>> result.acked, result.rejected                          # doctest: +SKIP
    (120, [])
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from .backoff import Backoff
from .blame import blames_a_batch
from .codec import dumps, loads
from .spool import SpoolError, scan_spool
from .spoolfiles import rejected_path
from .wsclient import ingest_url, open_ingest


class UploadError(RuntimeError):
    """The server could not be reached, or refused the connection; says which and why."""


@dataclass
class UploadResult:
    """What an upload did: ``parts`` (hello sections), batches acknowledged and refused."""

    parts: int = 0
    batches: int = 0
    records: int = 0
    acked: int = 0
    rejected: list[tuple[int, int, str]] = field(default_factory=list)  # (seq, code, why)
    rejected_file: Path | None = None
    skipped_lines: list[str] = field(default_factory=list)  # "path:line: why", each sent on
    foreign_lines: list[str] = field(default_factory=list)  # batches of another run


def scan_parts(
    path: str | os.PathLike[str],
) -> tuple[list[tuple[dict[str, Any], list[dict[str, Any]]]], list[str], list[str]]:
    """The spool as ``[(hello, [batch, ...]), ...]``, the lines skipped (each named
    ``path:line: why``) and, among them, the batches of another run than their hello's.

    Raises SpoolError when no line at all can be sent.
    """
    messages, problems, _ = scan_spool(path)
    parts: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    foreign: list[str] = []
    for number, message in messages:
        kind = message["type"]
        where = f"{path}:{number}: "
        if kind == "hello":
            parts.append((message, []))
            continue
        if kind != "batch":
            problems.append(f"{where}expected 'hello' or 'batch', got {kind!r}")
            continue
        if not parts:
            problems.append(f"{where}expected a hello before the first batch")
            continue
        seq, records = message.get("seq"), message.get("records")
        blocks = message.get("columns", [])
        hello = parts[-1][0]
        if type(seq) is not int or not isinstance(records, list):
            problems.append(f"{where}expected a batch with an integer seq and a records "
                            f"list, got keys {sorted(message)}")
        elif not isinstance(blocks, list) or not all(
            isinstance(b, dict) and type(b.get("n")) is int for b in blocks
        ):
            problems.append(f"{where}expected columns as a list of blocks, each with an "
                            f"integer n, got {str(blocks)[:60]}")
        elif (message.get("run_id"), message.get("rank")) != (hello.get("run_id"),
                                                            hello.get("rank")):
            why = (f"{where}a batch of run {str(message.get('run_id'))[:40]!r} rank "
                   f"{message.get('rank')!r} after the hello of run "
                   f"{str(hello.get('run_id'))[:40]!r} rank {hello.get('rank')!r}")
            problems.append(why)
            foreign.append(why)
        else:
            parts[-1][1].append(message)
    problems.sort(key=_line_number)
    if not any(batches for _, batches in parts) and problems:
        raise SpoolError("; ".join(problems[:5]) + (
            f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))
    return parts, problems, foreign


def _line_number(problem: str) -> int:
    found = re.search(r":(\d+): ", problem)
    return int(found.group(1)) if found else 0


def split_parts(path: str | os.PathLike[str]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The spool as ``[(hello, [batch, ...]), ...]``; raises SpoolError at a bad line."""
    parts, problems, _ = scan_parts(path)
    if problems:
        raise SpoolError(problems[0])
    return parts


def record_count(batch: dict[str, Any]) -> int:
    """The records a batch message carries: its ``records`` and its blocks' ``n``."""
    blocks: list[dict[str, Any]] = batch.get("columns", [])
    return len(batch["records"]) + sum(int(block["n"]) for block in blocks)


def upload(
    path: str | os.PathLike[str],
    server: str,
    token: str | None = None,
    *,
    timeout: float = 30.0,
    window: int = 64,
) -> UploadResult:
    """Send every part of the spool at ``path`` to ``server``; see the module docstring.

    ``timeout`` bounds the whole upload's waiting for a server that is away or silent.
    """
    url = ingest_url(server)
    parts, skipped, foreign = scan_parts(path)
    result = UploadResult(parts=len(parts), skipped_lines=skipped, foreign_lines=foreign)
    deadline = time.monotonic() + timeout
    for hello, batches in parts:
        result.batches += len(batches)
        result.records += sum(record_count(b) for b in batches)
        _upload_part(url, token, hello, batches, result, deadline, window, Path(path))
    return result


def _upload_part(
    url: str, token: str | None, hello: dict[str, Any], batches: list[dict[str, Any]],
    result: UploadResult, deadline: float, window: int, path: Path,
) -> None:
    todo = deque((b["seq"], dumps(b)) for b in batches)
    acked_at_start = result.acked  # acks after this part's hello: it was accepted
    backoff = Backoff(0.05, 2.0)
    last_trouble = ""
    while todo:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise UploadError(
                f"{len(todo)} batch(es) of run {hello.get('run_id')} not acknowledged by {url} "
                f"in time ({last_trouble or 'no answer'}); run the upload again to send them"
            )
        try:
            ws = open_ingest(url, token, min(10.0, remaining))
        except Exception as e:
            last_trouble = f"cannot reach the server: {e}"
            time.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))
            continue
        try:
            error = _send_in_order(ws, hello, todo, result, deadline, window)
        finally:
            ws.close()
        if error is None:
            if todo:
                last_trouble = "the connection was lost"
            continue
        code, message, named = error
        # As in the sender: the batch the error names, else the oldest in flight, but only
        # when the error cannot be about the hello (protocol/blame.py).
        blame_batch = blames_a_batch(code, message, named, result.acked > acked_at_start)
        index = 0 if named is None else next(
            (i for i, (s, _) in enumerate(todo) if s == named), None
        )
        if blame_batch and todo and index is None:
            continue  # it names a batch already acknowledged: go on with the rest
        if blame_batch and todo and index is not None:
            seq, text = todo[index]
            del todo[index]
            result.rejected.append((seq, code, message))
            result.rejected_file = rejected_path(path)
            with open(result.rejected_file, "a", encoding="utf-8") as f:
                f.write(text + "\n")
            backoff.reset()
            continue
        raise UploadError(f"{url} refused the upload (code {code}: {message})")


def _send_in_order(
    ws: ClientConnection, hello: dict[str, Any], todo: deque[tuple[int, str]],
    result: UploadResult, deadline: float, window: int,
) -> tuple[int, str, int | None] | None:
    """Hello, then the batches of ``todo`` pipelined; acked ones leave ``todo``.

    Returns the server's (code, message, seq it names or None) when it refused
    something, else None.
    """
    try:
        ws.send(dumps(hello))
        sent = 0
        while todo:
            while sent < min(window, len(todo)):
                ws.send(todo[sent][1])
                sent += 1
            raw = ws.recv(timeout=max(0.0, deadline - time.monotonic()))
            message = loads(raw)
            if message.get("type") == "error":
                return _error(message)
            if message.get("type") == "ack" and _take_ack(message, todo, result):
                sent -= 1
    except TimeoutError:
        return None
    except ConnectionClosed as e:
        # The server may have explained itself before closing: read what it sent. A send
        # can fail on the close before an ack sent ahead of the error was read: it counts
        # (the blame for an error naming no seq depends on it).
        try:
            while True:
                message = loads(ws.recv(timeout=2.0))
                if isinstance(message, dict) and message.get("type") == "error":
                    return _error(message)
                if isinstance(message, dict) and message.get("type") == "ack":
                    _take_ack(message, todo, result)
        except (ConnectionClosed, TimeoutError, ValueError):
            pass
        if e.rcvd is not None and e.rcvd.code in (1007, 1008, 1009):
            return e.rcvd.code, e.rcvd.reason, None
    return None


def _take_ack(message: dict[str, Any], todo: deque[tuple[int, str]], result: UploadResult) -> bool:
    """Drop the acknowledged batch from ``todo``; False for a repeat of an acked seq (acks
    come in order on one connection, and a repeat is fine)."""
    seq = message.get("seq")
    for index, (pending, _) in enumerate(todo):
        if pending == seq:
            del todo[index]
            result.acked += 1
            return True
    return False


def _error(message: dict[str, Any]) -> tuple[int, str, int | None]:
    seq = message.get("seq")
    named = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
    return int(message.get("code", 0) or 0), str(message.get("message", "")), named
