"""What ``WebSocketSink.send`` queues: records encoded as the insides of batches.

Step records that a block can hold travel as ``columns`` (protocol/columns.py), the
others as ``records`` (series packed); a batch holds at most ``max_bytes`` of them and
10,000 records. A record too big for any message is counted, not queued.

Example:
    >>> bodies, dropped = encode_batches(
    ...     [{"kind": "epoch", "epoch": 0}, {"kind": "step", "step": 0}], 1 << 20)
    >>> body, columns, n = bodies[0]
    >>> body, columns[:30], n, dropped
    ('{"kind":"epoch","epoch":0}', '{"kind":"step","n":1,"step":{"', 2, 0)
"""

from __future__ import annotations

from typing import Any

from .codec import pack_timesteps
from .columns import block_json, slice_block, to_columns
from .messages import MAX_MESSAGE_BYTES, MAX_RECORDS_PER_BATCH
from .outbox import ENVELOPE_BYTES, encode_records


def encode_batches(
    records: list[dict[str, Any]], max_bytes: int, *, columns: bool = True,
    pack_series: bool = True,
) -> tuple[list[tuple[str, str, int]], int]:
    """(records inside, columns inside, record count) of each batch, and the number of
    records too big for any message. ``columns`` False: every record in ``records``."""
    rest, blocks = to_columns(records, max_bytes) if columns else (records, [])
    if pack_series:
        rest = pack_timesteps(rest)
    chunks, too_big = encode_records(rest, max_bytes) if rest else ([], [])
    texts, blocks_too_big = encode_blocks(blocks, max_bytes)
    return batch_bodies(chunks, texts, max_bytes), len(too_big) + blocks_too_big


def encode_blocks(
    blocks: list[dict[str, Any]], max_bytes: int
) -> tuple[list[tuple[str, int]], int]:
    """Blocks (protocol/columns.py) as JSON texts of at most ``max_bytes`` each: a bigger
    block becomes blocks of fewer records; one record alone may exceed ``max_bytes``
    up to the message limit (a batch of its own).

    Returns (texts with their record counts, records too big for any message).
    """
    texts: list[tuple[str, int]] = []
    too_big = 0
    todo = list(reversed(blocks))
    while todo:
        block = todo.pop()
        text, n = block_json(block), block["n"]
        if len(text) <= max_bytes or (n == 1 and len(text) <= MAX_MESSAGE_BYTES - ENVELOPE_BYTES):
            texts.append((text, n))
        elif n == 1:
            too_big += 1
        else:
            parts = min(n, -(-len(text) // max_bytes))
            size = -(-n // parts)
            todo.extend(
                slice_block(block, start, min(n, start + size))
                for start in reversed(range(0, n, size))
            )
    return texts, too_big


def batch_bodies(
    chunks: list[tuple[str, int]], blocks: list[tuple[str, int]], max_bytes: int
) -> list[tuple[str, str, int]]:
    """(records inside, columns inside, record count) of each batch for encoded record
    ``chunks`` then block texts: a block joins the last batch while it fits in
    ``max_bytes`` and 10,000 records."""
    out: list[tuple[str, list[str], int, int]] = [(body, [], n, len(body)) for body, n in chunks]
    for text, n in blocks:
        if out:
            body, texts, count, size = out[-1]
            if size + 1 + len(text) <= max_bytes and count + n <= MAX_RECORDS_PER_BATCH:
                texts.append(text)
                out[-1] = (body, texts, count + n, size + 1 + len(text))
                continue
        out.append(("", [text], n, len(text)))
    return [(body, ",".join(texts), n) for body, texts, n, _ in out]
