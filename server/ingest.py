"""``WS /ws/ingest``: trainers send ``hello`` then ``batch`` messages; each batch is
acknowledged after it is committed.

The receive half validates each message and hands it to the store's writer without
waiting; an ack task awaits the commits in order, sends ``ack`` and then publishes
to live viewers. Up to ``Settings.ingest_window`` batches may be in flight per
connection, so a trainer that pipelines is not bound by one commit per round trip,
and the writer can commit many batches of many trainers in one transaction.

A bad message gets ``{"type": "error", "code": ..., "message": ...}`` and a close
with that code (1007 data, 1008 policy, 1009 size), after the acks of the batches
before it; nothing of the bad message is stored. A batch with one bad field in a
record is stored without that field (server/repair.py) and its ``ack`` carries a
``notice`` saying what was left out. A batch the database refuses for its values is
refused (1007, naming its ``seq``); only a transient store fault closes with 1011,
which asks the trainer to resend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from concurrent.futures import Future

from starlette.websockets import WebSocket, WebSocketDisconnect

from gradwatch.protocol import messages as m
from gradwatch.protocol.codec import dumps
from gradwatch.protocol.names import identity_problem

from .columns import records_json
from .repair import parse_repairing
from .schema import Batch, Hello
from .schema_errors import ProtocolError
from .security import (
    can_read,
    can_write,
    host_problem,
    origin_problem,
    read_token_from,
    token_from,
)
from .state import AppState
from .store import StoreDataError

CLOSE_INTERNAL = 1011
log = logging.getLogger("gradwatch.ingest")


async def reject(ws: WebSocket, code: int, message: str, seq: int | None = None) -> None:
    """Send an ``error`` message (naming ``seq`` when given), then close with ``code``."""
    error: dict[str, object] = {"type": m.ERROR, "code": code, "message": message}
    if seq is not None:
        error["seq"] = seq
    with contextlib.suppress(Exception):
        await ws.send_text(dumps(error))
    reason = message.encode()[:120].decode("utf-8", "ignore")
    with contextlib.suppress(Exception):
        await ws.close(code=code, reason=reason)


def websocket_problem(ws: WebSocket, state: AppState, write: bool) -> str | None:
    """Why this websocket may not go on (Host, Origin, token), or None."""
    headers = ws.headers
    problem = host_problem(state.settings, headers.get("host"))
    if problem is None:
        problem = origin_problem(headers.get("host"), headers.get("origin"))
    if problem is None:
        token = (token_from(headers, ws.query_params) if write
                 else read_token_from(headers, ws.query_params, ws.cookies))
        if write and not can_write(state.settings, token):
            problem = "expected the ingest token (Authorization: Bearer or ?token=), got " + (
                "a wrong one" if token else "none"
            )
        elif not write and not can_read(state.settings, token):
            problem = (
                "expected a view token (the dashboard's cookie, the gradwatch.token.<base64url>"
                " subprotocol, ?token= or Authorization: Bearer), got "
                + ("a wrong one" if token else "none")
            )
    return problem


def message_text(message: Mapping[str, object], limit: int) -> str:
    """The text of one received frame; ProtocolError for binary or oversized frames."""
    text = message.get("text")
    if not isinstance(text, str):
        raise ProtocolError(
            m.CLOSE_INVALID_DATA,
            "expected a text frame holding one JSON object, got a binary frame",
        )
    # Characters are at most 4 bytes; encode only when the text may be too long.
    if len(text) * 4 > limit and len(text.encode()) > limit:
        raise ProtocolError(
            m.CLOSE_TOO_BIG,
            f"expected a message of at most {limit} bytes, got {len(text.encode())}",
        )
    return text


class IngestConnection:
    """One trainer's connection: hello, then batches, acknowledged in order."""

    def __init__(self, ws: WebSocket, state: AppState) -> None:
        self.ws = ws
        self.state = state
        self.hello: Hello | None = None
        self.window = asyncio.Semaphore(state.settings.ingest_window)
        self.pending: asyncio.Queue[
            tuple[Batch, asyncio.Future[bool], list[str]] | None
        ] = asyncio.Queue()
        self.failure: ProtocolError | None = None
        self.failure_seq: int | None = None

    async def run(self) -> None:
        acker = asyncio.create_task(self._ack_loop())
        error: ProtocolError | None = None
        try:
            error = await self._receive_loop()
        finally:
            await self.pending.put(None)
            await acker
            if self.hello is not None:
                self.state.connected[self.hello.run_id] -= 1
                if self.state.connected[self.hello.run_id] <= 0:
                    del self.state.connected[self.hello.run_id]
                self.state.run_changed(self.hello.run_id)
        if error is not None and self.failure is None:
            await reject(self.ws, error.code, error.message)

    async def _receive_loop(self) -> ProtocolError | None:
        limit = self.state.settings.max_message_bytes
        while self.failure is None:
            try:
                message = await self.ws.receive()
            except WebSocketDisconnect:
                return None
            if message["type"] == "websocket.disconnect":
                return None
            try:
                parsed, notices = parse_repairing(message_text(message, limit))
                await self._handle(parsed, notices)
            except ProtocolError as error:
                return error
        return None

    async def _handle(self, msg: Hello | Batch, notices: list[str]) -> None:
        if isinstance(msg, Hello):
            if self.hello is not None:
                raise ProtocolError(m.CLOSE_POLICY, "expected a batch, got a second hello")
            if msg.protocol != m.PROTOCOL_VERSION:
                raise ProtocolError(
                    m.CLOSE_POLICY,
                    f"protocol: expected {m.PROTOCOL_VERSION}, got {msg.protocol}",
                )
            problem = identity_problem(msg.run_id, "run_id")
            if problem is not None:
                raise ProtocolError(m.CLOSE_INVALID_DATA, problem)
            try:
                written = self.state.writes.track(self.state.store.submit_hello(msg))
                await asyncio.wrap_future(written)
            except StoreDataError as error:
                raise ProtocolError(
                    m.CLOSE_INVALID_DATA, f"hello: the database refused it: {error}"[:300]
                ) from None
            except Exception as error:  # answered, never a traceback: the trainer retries
                log.warning("could not store the hello of run %.80r: %s", msg.run_id, error)
                raise ProtocolError(
                    CLOSE_INTERNAL, f"the server could not store the hello: {error}"[:300]
                ) from None
            self.hello = msg
            self.state.connected[msg.run_id] += 1
            self.state.run_changed(msg.run_id, urgent=True)
            return
        if self.hello is None:
            raise ProtocolError(m.CLOSE_POLICY, "expected a hello first, got a batch")
        if msg.run_id != self.hello.run_id or msg.rank != self.hello.rank:
            raise ProtocolError(
                m.CLOSE_POLICY,
                f"batch: expected run_id {self.hello.run_id[:40]!r} rank {self.hello.rank}"
                f" (from hello), got {msg.run_id[:40]!r} rank {msg.rank}",
            )
        await self.window.acquire()
        future: Future[bool] = self.state.writes.track(
            self.state.store.submit_batch(msg, self.hello.session)
        )
        await self.pending.put((msg, asyncio.wrap_future(future), notices))

    async def _ack_loop(self) -> None:
        while True:
            item = await self.pending.get()
            if item is None:
                return
            batch, future, notices = item
            try:
                stored = await future
            except Exception as error:
                self.window.release()
                if self.failure is None:
                    # A refusal for the values recurs on every resend: refused for good
                    # (1007, the batch named). Anything else may pass: 1011, resend.
                    data = isinstance(error, StoreDataError)
                    self.failure = ProtocolError(
                        m.CLOSE_INVALID_DATA if data else CLOSE_INTERNAL,
                        f"batch {batch.seq}: the server could not store it: {error}"[:300],
                    )
                    # Closing ends the receive loop; the trainer resends what is unacknowledged.
                    await reject(self.ws, self.failure.code, self.failure.message, batch.seq)
                continue
            self.window.release()
            if self.failure is None:
                live = self.state.watched(batch.run_id)
                ack = f'{{"type":"ack","seq":{batch.seq},"live":{"true" if live else "false"}}}'
                if notices:
                    log.warning("run %.80r batch %d: %s", batch.run_id, batch.seq,
                                "; ".join(notices)[:500])
                    ack = dumps({"type": m.ACK, "seq": batch.seq, "live": live,
                                 "notice": "; ".join(notices)})
                with contextlib.suppress(Exception):
                    await self.ws.send_text(ack)
            if stored:
                self._publish(batch)

    def _publish(self, batch: Batch) -> None:
        state = self.state
        if self.hello is not None:
            state.on_batch(self.hello, batch)  # /metrics, stalled, alert webhooks
        if state.hub.has_viewers(batch.run_id):
            records = records_json(batch)
            head = dumps(
                {"type": "records", "run_id": batch.run_id, "rank": batch.rank, "seq": batch.seq}
            )
            state.hub.publish(batch.run_id, head[:-1] + ',"records":' + records + "}")
        urgent = any(r.kind in (m.END, m.ALERT) for r in batch.records)
        state.run_changed(batch.run_id, urgent=urgent)


async def ingest_endpoint(ws: WebSocket) -> None:
    """The ``/ws/ingest`` handler."""
    state: AppState = ws.app.state.gradwatch
    await ws.accept()
    problem = websocket_problem(ws, state, write=True)
    if problem is not None:
        await reject(ws, m.CLOSE_POLICY, problem)
        return
    await IngestConnection(ws, state).run()
