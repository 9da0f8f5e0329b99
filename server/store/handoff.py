"""Validated messages handed from the server process to its writer process.

A frame is ``<u32 head length><u32 body length><head JSON><body bytes>``. A batch's
column blocks travel as their raw bytes (already checked, already little-endian) with
a small JSON head naming what they hold, so the writer process rebuilds them without
parsing or validating anything twice; a batch's other records (few: epochs, alerts,
ends, odd steps) travel as their validated JSON and are validated again there. Only
this server's own processes speak it, over a pipe; nothing from the network is
unpickled or evaluated.

Example:
    >>> from gradwatch.server.schema import parse_message
    >>> batch = parse_message('{"type": "batch", "run_id": "r", "rank": 0, "seq": 3,'
    ...                       ' "records": [{"kind": "epoch", "epoch": 1}]}')
    >>> head, parts = encode_batch(batch, "s1")
    >>> head["id"] = 7
    >>> ident, again, session = decode_batch(head, b"".join(parts))
    >>> ident, again.seq, again.records[0].epoch, session
    (7, 3, 1, 's1')
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Sequence
from typing import IO, Any

from gradwatch.protocol.column_shapes import FLOAT_COLUMNS

from ..schema import (
    RECORDS,
    Batch,
    FloatColumn,
    IntColumn,
    NamedColumns,
    StepColumns,
    TimestepColumns,
)
from .chunks import CHUNK_FIELDS

_SIZES = struct.Struct("<II")


def write_frame(out: IO[bytes], head: dict[str, Any], body: Sequence[bytes] = ()) -> None:
    """One frame: the head as JSON, then the body's parts (written as they are, not
    joined: a batch's body is ~300 KB)."""
    text = json.dumps(head, separators=(",", ":")).encode()
    out.write(_SIZES.pack(len(text), sum(map(len, body))) + text)
    for part in body:
        out.write(part)


def frame_bytes(batch: Batch, session: str) -> bytes:
    """A batch's frame as one bytes object (kept by PostgreSQL for other replicas)."""
    head, parts = encode_batch(batch, session)
    head["id"] = 0
    out = io.BytesIO()
    write_frame(out, head, parts)
    return out.getvalue()


def batch_of(data: bytes) -> Batch:
    """The batch of :func:`frame_bytes`."""
    frame = read_frame(io.BytesIO(data))
    if frame is None:
        raise ValueError(f"expected a whole frame, got {len(data)} bytes")
    return decode_batch(*frame)[1]


def read_frame(source: IO[bytes]) -> tuple[dict[str, Any], bytes] | None:
    """The next frame, or None at the end of the stream."""
    sizes = _read_exactly(source, _SIZES.size)
    if sizes is None:
        return None
    head_size, body_size = _SIZES.unpack(sizes)
    head = _read_exactly(source, head_size)
    body = _read_exactly(source, body_size) if body_size else b""
    if head is None or body is None:
        return None
    return json.loads(head), body


def _read_exactly(source: IO[bytes], size: int) -> bytes | None:
    data = source.read(size)
    while data is not None and 0 < len(data) < size:
        more = source.read(size - len(data))
        if not more:
            return None
        data += more
    return data if data is not None and len(data) == size else None


def encode_batch(batch: Batch, session: str) -> tuple[dict[str, Any], list[bytes]]:
    """A validated batch as a frame's head (``id`` still to be set) and body parts."""
    parts: list[bytes] = []
    records = RECORDS.dump_json(batch.records, exclude_unset=True) if batch.records else b""
    parts.append(records)
    blocks = []
    for block in batch.columns:
        fields = [name for name in CHUNK_FIELDS if getattr(block, name, None) is not None]
        parts.append(block.step.i64)
        for name in fields:
            column = getattr(block, name)
            parts.append(column.f64 if name in FLOAT_COLUMNS else column.i64)
        named = block.named.names if block.named is not None else None
        if block.named is not None:
            parts.append(block.named.f64)
        series = []
        for module, by_series in (block.timesteps or {}).items():
            for name, column in by_series.items():
                series.append([module, name, column.length])
                parts.append(column.f64)
        blocks.append({"n": block.n, "fields": fields, "named": named, "timesteps": series})
    head = {
        "op": "batch",
        "session": session,
        "run_id": batch.run_id,
        "rank": batch.rank,
        "seq": batch.seq,
        "records": len(records),
        "blocks": blocks,
        "extra": batch.__pydantic_extra__ or {},
    }
    return head, parts


def decode_batch(head: dict[str, Any], body: bytes) -> tuple[int, Batch, str]:
    """(id, batch, session) of a batch frame made by :func:`encode_batch`."""
    view = memoryview(body)
    at = head["records"]
    records = RECORDS.validate_json(bytes(view[:at])) if at else []
    columns = []
    for spec in head["blocks"]:
        n = spec["n"]
        size = 8 * n
        values: dict[str, Any] = {"kind": "step", "n": n}
        values["step"] = IntColumn.model_construct(i64=bytes(view[at : at + size]))
        at += size
        for name in spec["fields"]:
            data = bytes(view[at : at + size])
            at += size
            if name in FLOAT_COLUMNS:
                values[name] = FloatColumn.model_construct(f64=data)
            else:
                values[name] = IntColumn.model_construct(i64=data)
        if spec["named"] is not None:
            width = size * len(spec["named"])
            values["named"] = NamedColumns.model_construct(
                names=spec["named"], f64=bytes(view[at : at + width])
            )
            at += width
        if spec["timesteps"]:
            timesteps: dict[str, dict[str, TimestepColumns]] = {}
            for module, name, length in spec["timesteps"]:
                width = size * length
                timesteps.setdefault(module, {})[name] = TimestepColumns.model_construct(
                    length=length, f64=bytes(view[at : at + width])
                )
                at += width
            values["timesteps"] = timesteps
        columns.append(StepColumns.model_construct(**values))
    batch = Batch.model_construct(
        type="batch",
        run_id=head["run_id"],
        rank=head["rank"],
        seq=head["seq"],
        records=records,
        columns=columns,
        **head["extra"],
    )
    return head["id"], batch, head["session"]
