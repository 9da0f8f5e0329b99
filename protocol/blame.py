"""Which batch a server's error is about, so the sender sets aside only that one.

The server answers in order and closes after an ``error`` (docs/PROTOCOL.md). An error
may name the refused batch's ``seq`` (an optional field); then that batch is to blame.
Without one it concerns the oldest batch in flight, unless it is about the ``hello``:
then no batch is to blame, and dropping one after another would lose them all. A batch
is blamed when the hello was accepted (an ack came on this connection), when the
message was too big (a hello never is), or when the error names the records.

Example:
    >>> blames_a_batch(1007, "records[3].step: expected an integer", None, False)
    True
    >>> blames_a_batch(1008, "expected the ingest token", None, False)
    False
"""

from __future__ import annotations

from .messages import CLOSE_INVALID_DATA, CLOSE_TOO_BIG


def blames_a_batch(code: int, message: str, error_seq: int | None, acked_since: bool) -> bool:
    """Whether the error with ``code``/``message`` refuses a batch (not the connection).

    ``acked_since``: whether the server acknowledged a batch on this connection.
    """
    if code == CLOSE_TOO_BIG:
        return True
    return code == CLOSE_INVALID_DATA and (
        error_seq is not None or acked_since or message.startswith(("records", "batch"))
    )
