"""A validated batch as the rows of every table: its step records as chunks
(store/chunks.py), its epochs, alerts and ends as rows of their own.

Step records come as ``columns`` blocks or one by one (docs/PROTOCOL.md); the store
keeps both ONE way, so every read has one path: consecutive step records of one shape
become one :class:`Block`, as a wire block does, with what a wire block cannot
carry (``backward_passes``, ``depth`` series, other fields as ``notes``).

Example:
    >>> from gradwatch.server.schema import parse_message
    >>> batch = parse_message('{"type": "batch", "run_id": "r", "rank": 0, "seq": 0,'
    ...     ' "records": [{"kind": "step", "step": 4, "loss": "NaN", "backward_passes": 3},'
    ...     ' {"kind": "step", "step": 5, "loss": 0.5, "backward_passes": 2},'
    ...     ' {"kind": "epoch", "epoch": 1, "step": 5}]}')
    >>> (block,) = step_blocks(batch.records)
    >>> block.n, sorted(block.columns)
    (2, ['backward_passes', 'epoch', 'loss', 'step'])
    >>> split = split_batch(batch, lambda v: v)
    >>> len(split.steps), len(split.epochs), split.last_step, split.last_epoch
    (1, 1, 5, 1)
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, NamedTuple

import numpy as np

from gradwatch.protocol.column_shapes import FLOAT_COLUMNS, PROFILE_KEYS, pack_floats
from gradwatch.protocol.columns import split_name
from gradwatch.protocol.messages import MAX_RECORDS_PER_BATCH

from ..column_checks import ints
from ..schema import StepColumns
from .chunks import CHUNK_FIELDS, INT_FIELDS, SCALAR_FIELDS, ColumnGroup, cuts

# Kept per record in ``notes`` (besides fields the server does not know).
NOTE_FIELDS = ("nonfinite", "timestep_layout")

EPOCH_INSERT = (
    "INSERT INTO epochs (run_id, rank, epoch, step, t, duration_s, steps, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
ALERT_INSERT = (
    "INSERT INTO alerts (run_id, rank, step, code, severity, state, subject, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
END_UPDATE = (
    "UPDATE ranks SET end_status = ?, end_step = ?, end_t = ? WHERE run_id = ? AND rank = ?"
)


@dataclass
class SplitBatch:
    # Chunk rows by table (named rows as (names, row without written and set id): the
    # writer adds those) and each chunk's rollup groups.
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    named: list[tuple[tuple[str, ...], tuple[Any, ...]]] = field(default_factory=list)
    series: list[tuple[Any, ...]] = field(default_factory=list)
    groups: list[ColumnGroup] = field(default_factory=list)
    epochs: list[tuple[Any, ...]] = field(default_factory=list)
    alerts: list[tuple[Any, ...]] = field(default_factory=list)
    # Problems the batch's alerts open: what the runs list counts (docs/API.md).
    problems: int = 0
    ends: list[tuple[Any, ...]] = field(default_factory=list)
    keys: set[tuple[str, str, str]] = field(default_factory=set)
    # The batch's largest step and epoch; -1: it has none.
    last_step: int = -1
    last_epoch: int = -1


def split_batch(batch: Any, scalar: Callable[[Any], Any], session: str = "") -> SplitBatch:
    """Rows of every table for one validated batch (``scalar``: the backend's way of
    storing a protocol number)."""
    out = SplitBatch()
    run_id, rank = batch.run_id, batch.rank
    # Unique per (run, rank, step) record: the batch's seq and the record's place in it,
    # salted with the session, where a new trainer process counts seq from 0 again.
    uid = (zlib.crc32(session.encode()) & 0xFFFFF) << 43 if session else 0
    uid += batch.seq * MAX_RECORDS_PER_BATCH
    for record in batch.records:
        kind = record.kind
        if kind == "epoch":
            out.last_epoch = max(out.last_epoch, record.epoch)
            if record.step is not None:
                out.last_step = max(out.last_step, record.step)
            times = (scalar(record.t), scalar(record.duration_s))
            dump = record.model_dump_json(exclude_none=True)
            out.epochs.append((run_id, rank, record.epoch, record.step, *times, record.steps, dump))
        elif kind == "alert":
            # The runs list counts problems, not alerts: as the sender says, else each
            # one raised without a ``problem``.
            opens = record.opens_problem
            if opens is None:
                opens = record.problem is None and record.state == "raised"
            out.problems += int(opens)
            said = (record.code, record.severity, record.state, record.subject)
            out.alerts.append((run_id, rank, record.step, *said, record.model_dump_json()))
        elif kind == "end":
            out.ends.append((record.status, record.step, scalar(record.t), run_id, rank))
    for block in (*step_blocks(batch.records), *map(wire_block, batch.columns)):
        add_block(out, block, run_id, rank, uid)
        uid += block.n
    return out


class Block(NamedTuple):
    """Step records of one shape as columns, from a wire block (:func:`wire_block`) or
    from records (:func:`step_blocks`): what :func:`add_block` stores."""

    n: int
    columns: dict[str, bytes]  # "step" and each plain field present: n int64 or float64
    names: tuple[str, ...]  # the named scalars: n rows of len(names) float64 in ``named``
    named: bytes
    series: list[tuple[str, str, str, int, bytes]]  # (family, module, series, len, n rows)
    notes: list[dict[str, Any] | None] | None = None  # what a column cannot hold, per record


def wire_block(block: StepColumns) -> Block:
    """A wire ``columns`` block as a :class:`Block` (it has no depth series, no notes)."""
    columns = {"step": block.step.i64}
    for name in CHUNK_FIELDS:
        column = getattr(block, name, None)  # backward_passes comes only from records
        if column is not None:
            columns[name] = column.i64 if name in INT_FIELDS else column.f64
    series = [
        ("timesteps", module, name, column.length, column.f64)
        for module, by_name in (block.timesteps or {}).items()
        for name, column in by_name.items()
    ]
    names, named = (tuple(block.named.names), block.named.f64) if block.named else ((), b"")
    return Block(block.n, columns, names, named, series)


def add_block(out: SplitBatch, block: Block, run_id: str, rank: int, uid: int) -> None:
    """Add one block's chunk rows, rollup groups and run_keys, and its last step and
    epoch; its records' uids are ``uid + 1 ...`` in block order."""
    step_column = block.columns["step"]
    steps = ints(step_column)
    last_epoch = max(ints(block.columns["epoch"])) if "epoch" in block.columns else 0
    out.last_step, out.last_epoch = max(out.last_step, max(steps)), max(out.last_epoch, last_epoch)
    present = [(name, block.columns[name]) for name in CHUNK_FIELDS if name in block.columns]
    fields = json.dumps([name for name, _ in present])
    rolled = [(name, data) for name, data in present if name in SCALAR_FIELDS]
    out.keys.update(("scalar", name, "") for name, _ in rolled)
    names = block.names
    for family, owner, key in map(split_name, names):  # a profiled module once, not per key
        out.keys.add((family, owner, "" if family == "profile" else key))
    out.keys.update((family, module, series) for family, module, series, _, _ in block.series)
    chunks = cuts(steps)
    out.groups.extend(_array_groups(steps, chunks, rolled, block))
    for start, stop in chunks:
        n, first, lo, hi = stop - start, uid + 1 + start, steps[start], steps[stop - 1]
        data = b"".join(d[8 * start : 8 * stop] for _, d in present)
        step_bytes = step_column[8 * start : 8 * stop]
        part = block.notes[start:stop] if block.notes is not None else None
        text = json.dumps(part, separators=(",", ":")) if part and any(part) else None
        out.steps.append((run_id, rank, lo, hi, first, n, fields, step_bytes, data, text))
        if names:
            data = block.named[8 * len(names) * start : 8 * len(names) * stop]
            out.named.append((names, (run_id, rank, lo, hi, first, n, step_bytes, data)))
        for family, module, series, length, values in block.series:
            cut = values[8 * length * start : 8 * length * stop]
            row = (run_id, rank, family, module, series, lo, hi, first, n, length, step_bytes, cut)
            out.series.append(row)


def _array_groups(
    steps: list[int], chunks: list[tuple[int, int]], rolled: list[tuple[str, bytes]], block: Block
) -> list[ColumnGroup]:
    """Each chunk's rollup groups as numpy matrices of one dtype (store/rollups.py):
    the int columns with the steps, the float columns, the named scalars."""
    n = len(steps)
    ints_ = [("step", block.columns["step"]), *(c for c in rolled if c[0] in INT_FIELDS)]
    floats_ = [c for c in rolled if c[0] not in INT_FIELDS]
    matrices: list[tuple[tuple[str, ...], Any]] = []
    for columns, dtype in ((ints_, "<i8"), (floats_, "<f8")):
        if columns:
            matrix = np.frombuffer(b"".join(d for _, d in columns), dtype).reshape(-1, n).T
            matrices.append((tuple(name for name, _ in columns), matrix))
    if block.names:
        matrix = np.frombuffer(block.named, "<f8").reshape(n, len(block.names))
        matrices.append((block.names, matrix))
    return [
        ColumnGroup(steps[start:stop], names, matrix[start:stop])
        for start, stop in chunks
        for names, matrix in matrices
    ]


def floats(values: list[Any]) -> bytes:
    packed = pack_floats(values)
    if packed is None:  # never for validated numbers
        raise ValueError(f"expected numbers, got {values[:3]!r}")
    return packed


def _ints(values: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def _named(record: Any) -> tuple[tuple[str, ...], list[Any]]:
    """A record's named scalars: their names in the order of a wire block, and values."""
    pairs: list[tuple[str, Any]] = []
    for family in ("param_norms", "update_ratios"):
        pairs += [(f"{family}/{p}", v) for p, v in (getattr(record, family) or {}).items()]
    for param, by_gate in (record.gate_norms or {}).items():
        pairs += [(f"gate_norms/{param}/{g}", v) for g, v in by_gate.items()]
    for module, entry in (record.profile or {}).items():
        found = [(key, getattr(entry, key)) for key in PROFILE_KEYS]
        pairs += [(f"profile/{module}/{key}", v) for key, v in found if v is not None]
    return tuple(name for name, _ in pairs), [value for _, value in pairs]


def _series(record: Any, family: str, module: str, name: str) -> bytes:
    values = record.depth[module] if family == "depth" else record.timesteps[module][name]
    packed = getattr(values, "f64", None)  # a series that came packed already is bytes
    return bytes(packed) if packed is not None else floats(values)


def _notes(record: Any) -> dict[str, Any] | None:
    out = {name: value for name in NOTE_FIELDS if (value := getattr(record, name)) is not None}
    out.update(record.__pydantic_extra__ or {})
    return out or None


def _shape(record: Any) -> tuple[Any, ...]:
    d = record.__dict__
    plain = tuple(f for f in (*FLOAT_COLUMNS, *INT_FIELDS) if d.get(f) is not None)
    names, values = _named(record)
    series = tuple(
        ("timesteps", module, name, len(values))
        for module, by_name in (record.timesteps or {}).items()
        for name, values in by_name.items()
    )
    series += tuple(("depth", stack, "input", len(v)) for stack, v in (record.depth or {}).items())
    return plain, names, series, values


def step_blocks(records: Sequence[Any]) -> Iterator[Block]:
    """The step records of ``records`` as blocks of consecutive records of one shape."""
    shaped = ((_shape(r), r) for r in records if r.kind == "step")
    for (plain, names, series), group in groupby(shaped, key=lambda item: item[0][:3]):
        run = list(group)
        records = [r for _, r in run]
        columns = {"step": _ints([r.step for r in records])}
        for name in plain:
            values = [getattr(r, name) for r in records]
            floating = name in FLOAT_COLUMNS
            columns[name] = floats(values) if floating else _ints([int(v) for v in values])
        named = floats([v for shape, _ in run for v in shape[3]]) if names else b""
        packed = [(*shape, b"".join(_series(r, *shape[:3]) for r in records)) for shape in series]
        notes = [_notes(r) for r in records]
        yield Block(len(records), columns, names, named, packed, notes if any(notes) else None)
