"""``WS /ws/live``: viewers receive what is stored, as it is stored.

``?run=<id>`` subscribes to one run's records; no ``run`` subscribes to the run
list (``{"type": "run", "run": <summary>}`` on every change). The send half drains
the viewer's bounded queue (see :mod:`gradwatch.server.live`); the receive half
notices a closed browser at once, so its queue is released without waiting for a
send to fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import struct
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from gradwatch.protocol import messages as m
from gradwatch.protocol.codec import dumps

from .ingest import reject, websocket_problem
from .live import RUNS_CHANNEL, Viewer
from .security import ws_subprotocol
from .state import AppState


async def _send_loop(ws: WebSocket, viewer: Viewer, timeout: float) -> None:
    """Send until the viewer is dropped for falling behind (or its socket fails)."""
    while True:
        text = await viewer.next()
        if text is None:
            return
        try:
            # The last notice of a dropped viewer gets a second: it may never read it.
            await asyncio.wait_for(ws.send_text(text), 1.0 if viewer.out else timeout)
        except TimeoutError:
            return  # its socket has taken nothing for `timeout` seconds: behind for good


async def _last_word(ws: WebSocket, viewer: Viewer) -> None:
    """Once the viewer is dropped: its ``lagged`` notice, if the socket takes it soon."""
    await viewer.gone.wait()
    await asyncio.sleep(0)  # let a send loop that is not stuck take the notice itself
    with contextlib.suppress(Exception):
        notice = viewer.notice()
        if notice is not None:
            await asyncio.wait_for(ws.send_text(notice), 1.0)


def abort(ws: WebSocket) -> None:
    """Drop the TCP connection now, unsent data and all.

    A graceful close would wait for the peer to read what is buffered, which a viewer
    that never reads never does (the connection and its buffers would stay). The
    server (uvicorn) hands the app its protocol's own ``send``, whose transport can
    abort; with any other server the connection ends when the app returns.
    """
    transport = _transport_of(getattr(ws, "_send", None))
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # Linger 0: close() resets the connection and frees what the kernel still holds
        # for the peer (megabytes for a viewer that stopped reading), instead of a FIN
        # queued behind that data for as long as the peer keeps its window shut.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _transport_of(send: Any) -> Any:
    """The transport behind an ASGI ``send``: uvicorn's protocol method, possibly
    wrapped by Starlette's ``sender`` closures (followed through their ``send``)."""
    for _ in range(16):
        protocol = getattr(send, "__self__", None)
        transport = getattr(protocol, "transport", None)
        if transport is not None and hasattr(transport, "abort"):
            return transport
        try:
            send = inspect.getclosurevars(send).nonlocals.get("send")
        except TypeError:
            return None
        if send is None:
            return None
    return None


async def _receive_loop(ws: WebSocket) -> None:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return


async def live_endpoint(ws: WebSocket) -> None:
    """The ``/ws/live`` handler."""
    state: AppState = ws.app.state.gradwatch
    await ws.accept(subprotocol=ws_subprotocol(ws.headers))
    problem = websocket_problem(ws, state, write=False)
    if problem is not None:
        await reject(ws, m.CLOSE_POLICY, problem)
        return
    run_id = ws.query_params.get("run") or None
    if run_id is not None and len(run_id) > m.MAX_NAME_CHARS:
        await reject(
            ws, m.CLOSE_INVALID_DATA, f"run: expected at most {m.MAX_NAME_CHARS} characters"
        )
        return
    viewer = state.hub.subscribe(run_id if run_id is not None else RUNS_CHANNEL)
    try:
        if run_id is not None:
            await state.statuses.viewer_joins(run_id)  # its status changes reach it from now
        if run_id is not None and state.replicas is not None:
            # Before "subscribed" (after which the viewer reads history): other replicas'
            # batches reach it live from here on, or are in that history (replicas.py).
            await state.replicas.viewer_joins()
        await ws.send_text(dumps({"type": "subscribed", "run_id": run_id}))
        timeout = state.settings.live_send_timeout_s
        tasks = [
            asyncio.create_task(_send_loop(ws, viewer, timeout)),
            asyncio.create_task(_receive_loop(ws)),
            # Dropped for falling behind: end now, even while a send waits on the socket.
            asyncio.create_task(_last_word(ws, viewer)),
        ]
        fell_behind = False
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            fell_behind = tasks[1] not in done
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, Exception):
                    await task
        if fell_behind:
            # Not a graceful close: that would wait on a peer that does not read.
            abort(ws)
    except WebSocketDisconnect:
        pass
    finally:
        state.hub.unsubscribe(viewer)
