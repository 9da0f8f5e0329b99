"""Step records sent one by one, turned into column blocks at ingest: ONE layout.

The wire carries step records two ways (docs/PROTOCOL.md): as ``columns`` blocks, and
as records (a trainer's odd steps: ``nonfinite``, ``backward_passes``,
``timestep_layout``, a field a newer trainer adds, or a sender that never packs).
The store keeps both the same way: consecutive step records of one shape (the same
fields, named names and series lengths) become one :class:`Block` shaped like a
wire block, stored as chunks (store/chunks.py), so every read has one path. A block
also carries what the wire's blocks cannot: ``backward_passes`` as an int64 column,
and each record's other fields (``nonfinite``, ``timestep_layout``, unknown ones) as
a JSON object in ``notes``. ``depth`` series are stored like ``timesteps`` (family
``depth``, series ``input``) and ``update_ratios`` like ``param_norms`` (named
scalars ``update_ratios/<parameter>``).

Example:
    >>> from gradwatch.server.schema import parse_message
    >>> batch = parse_message('{"type": "batch", "run_id": "r", "rank": 0, "seq": 0,'
    ...     ' "records": [{"kind": "step", "step": 4, "loss": "NaN", "backward_passes": 3},'
    ...     ' {"kind": "step", "step": 5, "loss": 0.5, "backward_passes": 2}]}')
    >>> ((block, uids),) = step_blocks(batch.records, 0)
    >>> block.n, sorted(block.present), list(uids)
    (2, ['backward_passes', 'epoch', 'loss'], [1, 2])
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gradwatch.protocol.messages import NONFINITE_STRINGS

# Plain fields of a step record, as the columns of a block name them.
FLOAT_FIELDS = ("t", "duration_s", "loss", "total_norm", "overhead")
INT_FIELDS = (
    "epoch",
    "graph_nodes",
    "rss_bytes",
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "graph_truncated",
    "backward_passes",
)
PROFILE_KEYS = ("forward_s", "backward_s", "calls")
# Kept per record in ``notes`` (besides fields the server does not know).
NOTE_FIELDS = ("nonfinite", "timestep_layout")
_LITTLE = sys.byteorder == "little"


@dataclass
class Column:
    """One packed column, as a wire block's ``{"i64": ...}`` or ``{"f64": ...}``."""

    i64: bytes = b""
    f64: bytes = b""
    length: int = 0  # a timestep series' values per record


@dataclass
class Named:
    names: list[str]
    f64: bytes


@dataclass
class Block:
    """Step records of one shape, with the attributes of a wire block (schema.
    StepColumns) that store/chunks.py reads, plus ``backward_passes`` and ``notes``."""

    n: int
    step: Column
    present: dict[str, Column] = field(default_factory=dict)
    named: Named | None = None
    timesteps: dict[str, dict[str, Column]] | None = None
    depth: dict[str, Column] | None = None  # stack -> one series per record
    notes: list[dict[str, Any] | None] | None = None

    def __getattr__(self, name: str) -> Any:
        # A plain field the block lacks reads None, as on a wire block.
        if name in FLOAT_FIELDS or name in INT_FIELDS:
            return self.__dict__["present"].get(name)
        raise AttributeError(name)


def floats(values: Sequence[Any]) -> bytes:
    """Little-endian float64 bytes; the "NaN"/"Infinity" strings become floats."""
    try:
        packed = array("d", values)
    except TypeError:
        packed = array("d", [NONFINITE_STRINGS[v] if isinstance(v, str) else v for v in values])
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


def _ints(values: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def _named(record: Any) -> tuple[tuple[str, ...], list[Any]]:
    """A record's named scalars: their names in the order of a wire block, and values."""
    names: list[str] = []
    values: list[Any] = []
    if record.param_norms:
        names.extend(f"param_norms/{p}" for p in record.param_norms)
        values.extend(record.param_norms.values())
    if record.update_ratios:
        names.extend(f"update_ratios/{p}" for p in record.update_ratios)
        values.extend(record.update_ratios.values())
    for param, by_gate in (record.gate_norms or {}).items():
        names.extend(f"gate_norms/{param}/{g}" for g in by_gate)
        values.extend(by_gate.values())
    for module, entry in (record.profile or {}).items():
        for key in PROFILE_KEYS:
            value = getattr(entry, key)
            if value is not None:
                names.append(f"profile/{module}/{key}")
                values.append(value)
    return tuple(names), values


def _series(values: Any) -> bytes:
    packed = getattr(values, "f64", None)  # a series that came packed already is bytes
    return bytes(packed) if packed is not None else floats(values)


def _notes(record: Any) -> dict[str, Any] | None:
    found = {name: getattr(record, name) for name in NOTE_FIELDS}
    out = {k: v for k, v in found.items() if v is not None}
    if record.__pydantic_extra__:
        out.update(record.__pydantic_extra__)
    return out or None


def _shape(record: Any) -> tuple[Any, ...]:
    d = record.__dict__
    plain = tuple(f for f in (*FLOAT_FIELDS, *INT_FIELDS) if d.get(f) is not None)
    names, values = _named(record)
    series = tuple(
        ("timesteps", module, name, len(values))
        for module, by_name in (record.timesteps or {}).items()
        for name, values in by_name.items()
    )
    if record.depth:
        series += tuple(("depth", stack, "", len(v)) for stack, v in record.depth.items())
    return plain, names, series, values


def step_blocks(records: Sequence[Any], uid: int) -> Iterator[tuple[Block, range]]:
    """The step records of ``records`` as blocks of consecutive records of one shape,
    each with its records' uids (``uid + 1`` for the first step record, then one more
    for each)."""
    run: list[tuple[Any, list[Any]]] = []
    key: Any = None
    first = uid + 1
    for record in records:
        if record.kind != "step":
            continue
        plain, names, series, values = _shape(record)
        if (plain, names, series) != key and run:
            yield _block(run, key), range(first, first + len(run))
            first += len(run)
            run = []
        key = (plain, names, series)
        run.append((record, values))
    if run:
        yield _block(run, key), range(first, first + len(run))


def _block(run: list[tuple[Any, list[Any]]], key: Any) -> Block:
    plain, names, series = key
    records = [r for r, _ in run]
    block = Block(len(records), Column(i64=_ints([r.step for r in records])))
    for name in plain:
        values = [getattr(r, name) for r in records]
        if name in FLOAT_FIELDS:
            block.present[name] = Column(f64=floats(values))
        else:
            block.present[name] = Column(i64=_ints([int(v) for v in values]))
    if names:
        block.named = Named(list(names), floats([v for _, vs in run for v in vs]))
    if series:
        block.timesteps = {}
        for family, module, name, length in series:
            if family == "timesteps":
                data = b"".join(_series(r.timesteps[module][name]) for r in records)
                block.timesteps.setdefault(module, {})[name] = Column(f64=data, length=length)
            else:  # a depth series: one per stack
                data = b"".join(_series(r.depth[module]) for r in records)
                block.depth = {**(block.depth or {}), module: Column(f64=data, length=length)}
        block.timesteps = block.timesteps or None
    notes = [_notes(r) for r in records]
    if any(notes):
        block.notes = notes
    return block
