"""The REST history API (docs/API.md). Every answer is JSON; non-finite numbers are
the protocol's strings; errors are ``{"detail": "expected ..., got ..."}``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from importlib import metadata
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, StrictBool

from gradwatch.protocol import messages as m
from gradwatch.protocol.codec import dumps

from .schema_errors import describe_value
from .security import can_read, can_write, read_token_from, token_from
from .state import AppState
from .store import RunNotFound

T = TypeVar("T")


INT64_MAX = 2**63 - 1  # steps and ranks are stored as 64-bit integers

# The most values (steps x timesteps, or points x fields) one answer may hold: about
# 20 MB of JSON; larger requests are downsampled (timesteps) or refused with 422.
MAX_CELLS = 1_000_000


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.gradwatch
    return state


def require_viewer(request: Request) -> AppState:
    """A FastAPI dependency: the view token (or the ingest token) when one is set."""
    state = _state(request)
    token = read_token_from(request.headers, request.query_params, request.cookies)
    if not can_read(state.settings, token):
        raise HTTPException(
            401,
            "expected a view token (Authorization: Bearer or ?token=), got "
            + ("a wrong one" if token else "none"),
        )
    return state


Viewer = Annotated[AppState, Depends(require_viewer)]


def require_admin(request: Request) -> AppState:
    """A FastAPI dependency for changes to runs: the ingest token, never the view token.

    A server with a view token but no ingest token has no token that may change runs
    (anyone may write there, and only the view token separates readers), so it refuses.
    """
    state = _state(request)
    token = token_from(request.headers, request.query_params)
    settings = state.settings
    if settings.token is None and settings.view_token is not None:
        raise HTTPException(
            403, "expected a server started with --token to change runs, got none set"
        )
    if not can_write(settings, token):
        raise HTTPException(
            401,
            "expected the ingest token (Authorization: Bearer or ?token=), got "
            + ("a view token or a wrong one" if token else "none"),
        )
    return state


Admin = Annotated[AppState, Depends(require_admin)]


def json_response(value: Any) -> Response:
    return Response(dumps(value), media_type="application/json")


async def _read(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A store query off the event loop; 404 for an unknown run, 422 for a bad field."""
    try:
        return await asyncio.to_thread(call, *args, **kwargs)
    except RunNotFound as error:
        # Not the whole id: a 100 KB id in must not be 100 KB out.
        got = describe_value(error.args[0])
        raise HTTPException(404, f"expected a known run id, got {got}") from None
    except ValueError as error:
        raise HTTPException(422, str(error)) from None


def version() -> str:
    try:
        return metadata.version("gradwatch")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare tree
        return "0+unknown"


router = APIRouter(prefix="/api")


HEALTH_TIMEOUT_S = 2.0


@router.get("/health", summary="Liveness, the store's, and what this server speaks")
async def health(request: Request) -> Response:
    """200 when the store answers a query within 2 s and its writer makes progress,
    else 503 with the reason."""
    state = _state(request)
    answer: dict[str, Any] = {
        "status": "ok",
        "version": version(),
        "protocol": m.PROTOCOL_VERSION,
        "db": state.store.kind,
    }
    try:
        await asyncio.wait_for(asyncio.to_thread(state.store.query, "SELECT 1 FROM runs LIMIT 1"),
                               HEALTH_TIMEOUT_S)
    except TimeoutError:
        answer.update(status="unavailable",
                      reason=f"the database did not answer within {HEALTH_TIMEOUT_S:.0f} s")
    except Exception as error:  # the reason is the answer; the server itself is up
        answer.update(status="unavailable",
                      reason=f"the database refused a query: {type(error).__name__}: {error}"[:300])
    stalled = state.writes.stalled(state.settings.writer_stall_s)
    if stalled is not None and answer["status"] == "ok":
        answer.update(status="unavailable", reason=stalled)
    answer.update(state.writes.snapshot())
    if answer["status"] != "ok":
        return Response(dumps(answer), status_code=503, media_type="application/json")
    return json_response(answer)


@router.get("/runs", summary="Every run's summary, newest first (archived ones on request)")
async def runs(state: Viewer, archived: bool = False) -> Response:
    found = await _read(state.store.list_runs)
    hidden = await _read(state.store.archived_ids)
    return json_response(
        [
            {**state.public(s), "archived": s["id"] in hidden}
            for s in found
            if archived or s["id"] not in hidden
        ]
    )


@router.get("/runs/{run_id}", summary="One run: summary, hellos, modules, series, parameters")
async def run(run_id: str, state: Viewer) -> Response:
    detail = await _read(state.store.run_detail, run_id)
    hidden = await _read(state.store.archived_ids)
    return json_response({**state.public(detail), "archived": run_id in hidden})


class ArchiveBody(BaseModel):
    archived: StrictBool


@router.put("/runs/{run_id}/archived", summary="Archive a run, or bring it back")
async def archive(run_id: str, body: ArchiveBody, state: Admin) -> Response:
    await _read(state.store.run_summary, run_id)  # 404 for an unknown run
    await _read(state.store.set_archived, run_id, body.archived)
    return json_response({"id": run_id, "archived": body.archived})


Step = Annotated[int | None, Query(ge=0, le=INT64_MAX)]


@router.get("/runs/{run_id}/steps", summary="Scalar series per step, min/max downsampled")
async def steps(
    run_id: str,
    state: Viewer,
    rank: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    start: Annotated[int | None, Query(alias="from", ge=0, le=INT64_MAX)] = None,
    stop: Annotated[int | None, Query(alias="to", ge=0, le=INT64_MAX)] = None,
    max_points: Annotated[int, Query(ge=2, le=1_000_000)] = 2000,
    fields: Annotated[str | None, Query(description="comma separated; default all")] = None,
) -> Response:
    names = [f for f in fields.split(",") if f] if fields else None
    return json_response(
        await _read(
            state.store.steps,
            run_id,
            rank=rank,
            start=start,
            stop=stop,
            fields=names,
            max_points=max_points,
            max_values=MAX_CELLS,
        )
    )


@router.get("/runs/{run_id}/timesteps", summary="The heatmap matrix of one module's series")
async def timesteps(
    run_id: str,
    state: Viewer,
    module: Annotated[str, Query(max_length=m.MAX_NAME_CHARS)],
    series: Annotated[str, Query(max_length=m.MAX_NAME_CHARS)] = "input",
    rank: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    max_steps: Annotated[int, Query(ge=1, le=100_000)] = 500,
    start: Annotated[int | None, Query(alias="from", ge=0, le=INT64_MAX)] = None,
    stop: Annotated[int | None, Query(alias="to", ge=0, le=INT64_MAX)] = None,
    max_cells: Annotated[int, Query(ge=2, le=MAX_CELLS)] = MAX_CELLS,
) -> Response:
    return json_response(
        await _read(
            state.store.timesteps,
            run_id,
            module,
            series=series,
            rank=rank,
            max_steps=max_steps,
            start=start,
            stop=stop,
            max_cells=max_cells,
        )
    )


@router.get("/runs/{run_id}/epochs", summary="Epoch records of one rank")
async def epochs(
    run_id: str, state: Viewer, rank: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0
) -> Response:
    return json_response(await _read(state.store.epochs, run_id, rank=rank))


@router.get("/runs/{run_id}/alerts", summary="Alert records in arrival order, with rank")
async def alerts(
    run_id: str, state: Viewer, rank: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None
) -> Response:
    return json_response(await _read(state.store.alerts, run_id, rank=rank))
