"""The child end of SQLite's writer process (store/writer_process.py starts it as
``python -m gradwatch.server.store.writer_child``): frames in on stdin, each one's
verdict out on stdout after its commit.

Its own module so that the imports point one way: sqlite.py starts a
:class:`~gradwatch.server.store.writer_process.ProcessWriter`, and this child runs a
:class:`~gradwatch.server.store.sqlite.SQLiteStore`.

Example (what the server process runs; the settings come in an environment variable):
    >>> main()   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import IO, Any

from ..schema import Hello
from ..settings import Settings
from .base import StoreDataError
from .handoff import decode_batch, read_frame, write_frame
from .sqlite import SQLiteStore


def main() -> None:
    """The child: frames in on stdin, verdicts out on stdout, in the order of commits."""
    values = json.loads(os.environ["GRADWATCH_WRITER_SETTINGS"])
    settings = replace(Settings(**values), writer_process=False)
    source: IO[bytes] = sys.stdin.buffer
    # The frames own stdout; anything printed by accident goes to stderr instead.
    out: IO[bytes] = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    out_lock = threading.Lock()
    store = SQLiteStore(settings)

    def answer(ident: int, future: Future[Any]) -> None:
        error = future.exception()
        head: dict[str, Any] = {"id": ident}
        if error is None:
            head["result"] = future.result()
        else:
            head["error"] = str(error)
            head["data_error"] = isinstance(error, StoreDataError)
        with out_lock, contextlib.suppress(OSError, ValueError):
            write_frame(out, head)
            # The writer thread's answers leave together after its group (flush_answers).
            if threading.current_thread() is not writer_thread:
                out.flush()

    def flush_answers() -> None:
        with out_lock, contextlib.suppress(OSError, ValueError):
            out.flush()

    writer_thread = store.writer_thread
    store.after_group = flush_answers

    try:
        while True:
            frame = read_frame(source)
            if frame is None:
                break
            head, body = frame
            future: Future[Any]
            if head["op"] == "hello":
                ident = int(head["id"])
                future = store.submit_hello(Hello.model_validate_json(head["hello"]))
            else:
                ident, batch, session = decode_batch(head, body)
                future = store.submit_batch(batch, session)
            future.add_done_callback(partial(answer, ident))
    finally:
        store.close()  # finishes every queued write (each answered), checkpoints


if __name__ == "__main__":
    main()
