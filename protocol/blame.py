"""Which batch a server's error is about, so the sender sets aside only that one.

The server answers in order and closes after an ``error`` (docs/PROTOCOL.md). An error
may name the refused batch's ``seq`` (an optional field); then that batch is to blame.
Without one it concerns the oldest batch in flight, unless it is about the ``hello``:
then no batch is to blame, and dropping one after another would lose them all. A batch
is blamed when the hello was accepted (an ack came after it, on this connection or an
earlier one: a sender's hello does not change), when the message was too big (a hello
never is), or when the error names the records.

Example:
    >>> blames_a_batch(1007, "records[3].step: expected an integer", None, False)
    True
    >>> blames_a_batch(1008, "expected the ingest token", None, False)
    False
"""

from __future__ import annotations

from .messages import CLOSE_INVALID_DATA, CLOSE_TOO_BIG


def blames_a_batch(
    code: int, message: str, error_seq: int | None, hello_accepted: bool
) -> bool:
    """Whether the error with ``code``/``message`` refuses a batch (not the connection).

    ``hello_accepted``: whether the server acknowledged a batch sent after this hello
    (on any connection: a connection may end before an ack on it was read, and the
    next one may start with the bad batch).
    """
    if code == CLOSE_TOO_BIG:
        return True
    return code == CLOSE_INVALID_DATA and (
        error_seq is not None or hello_accepted or message.startswith(("records", "batch"))
    )
