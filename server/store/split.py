"""A validated batch as the rows of every table: its step records (sent as records or
as columns) as chunks (store/records.py, store/chunks.py), its epochs, alerts and ends
as rows of their own.

Example:
    >>> from gradwatch.server.schema import parse_message
    >>> split = split_batch(parse_message('{"type": "batch", "run_id": "r", "rank": 0,'
    ...     ' "seq": 0, "records": [{"kind": "step", "step": 4, "loss": 0.5},'
    ...     ' {"kind": "epoch", "epoch": 1, "step": 4}]}'), lambda v: v)
    >>> len(split.chunks.steps), len(split.epochs), split.last_step, split.last_epoch
    (1, 1, 4, 1)
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic_core import to_json

from gradwatch.protocol.messages import MAX_RECORDS_PER_BATCH

from .chunks import Chunks, add_block
from .records import step_blocks

# The plain fields the history API serves (docs/API.md, ``/steps``), and the integer ones.
SCALAR_FIELDS = (
    "loss",
    "duration_s",
    "total_norm",
    "graph_nodes",
    "rss_bytes",
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "overhead",
    "backward_passes",
)
INTEGER_FIELDS = (
    "graph_nodes",
    "rss_bytes",
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "backward_passes",
)
EPOCH_INSERT = (
    "INSERT INTO epochs (run_id, rank, epoch, step, t, duration_s, steps, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
ALERT_INSERT = (
    "INSERT INTO alerts (run_id, rank, step, code, severity, state, subject, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def dumps(value: Any) -> str:
    """Compact JSON of stored values (pydantic-core's encoder: ~3x ``json.dumps``)."""
    return to_json(value).decode()


@dataclass
class SplitBatch:
    chunks: Chunks = field(default_factory=Chunks)
    epochs: list[tuple[Any, ...]] = field(default_factory=list)
    alerts: list[tuple[Any, ...]] = field(default_factory=list)
    # Problems the batch's alerts open: what the runs list counts (docs/API.md).
    problems: int = 0
    ends: list[tuple[str, int | None, Any]] = field(default_factory=list)
    keys: set[tuple[str, str, str]] = field(default_factory=set)
    last_step: int | None = None
    last_epoch: int | None = None


def opens_problem(record: Any) -> int:
    """1 when an alert record opens a problem (the runs list counts problems, not records).

    A sender that groups alerts by cause says so (``opens_problem``); for one that does
    not, each ``raised`` record without a ``problem`` counts.
    """
    if record.opens_problem is not None:
        return int(record.opens_problem)
    return int(record.problem is None and record.state == "raised")


def split_batch(batch: Any, scalar: Callable[[Any], Any], session: str = "") -> SplitBatch:
    """Rows of every table for one validated batch (``scalar``: the backend's way of
    storing a protocol number)."""
    out = SplitBatch()
    run_id, rank = batch.run_id, batch.rank
    last_step = last_epoch = -1
    # Unique per (run, rank, step) record: the batch's seq and the record's place in it,
    # salted with the session, where a new trainer process counts seq from 0 again.
    uid = (zlib.crc32(session.encode()) & 0xFFFFF) << 43 if session else 0
    uid += batch.seq * MAX_RECORDS_PER_BATCH
    for record in batch.records:
        kind = record.kind
        if kind == "epoch":
            last_epoch = max(last_epoch, record.epoch)
            if record.step is not None:
                last_step = max(last_step, record.step)
            out.epochs.append(
                (
                    run_id,
                    rank,
                    record.epoch,
                    record.step,
                    scalar(record.t),
                    scalar(record.duration_s),
                    record.steps,
                    record.model_dump_json(exclude_none=True),
                )
            )
        elif kind == "alert":
            out.problems += opens_problem(record)
            out.alerts.append(
                (
                    run_id,
                    rank,
                    record.step,
                    record.code,
                    record.severity,
                    record.state,
                    record.subject,
                    record.model_dump_json(),
                )
            )
        elif kind == "end":
            out.ends.append((record.status, record.step, record.t))
    blocks = [(block, uids.start - 1) for block, uids in step_blocks(batch.records, uid)]
    uid += sum(block.n for block, _ in blocks)
    for block in batch.columns:
        blocks.append((block, uid))
        uid += block.n
    for block, first in blocks:
        step, epoch = add_block(out.chunks, block, run_id, rank, first, out.keys)
        last_step, last_epoch = max(last_step, step), max(last_epoch, epoch)
    out.last_step = last_step if last_step >= 0 else None
    out.last_epoch = last_epoch if last_epoch >= 0 else None
    return out
