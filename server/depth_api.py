"""REST answers of gradient flow through depth (docs/API.md): ``/depth``, the depth x
training-step matrix of one stack, and ``/update_ratios``, the update-to-weight ratios
summed up per block. The reads are in server/depth_reads.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from gradwatch.protocol import messages as m

from .api import INT64_MAX, Viewer, _read, json_response
from .depth_reads import depth_matrix, update_ratio_blocks

depth_router = APIRouter(prefix="/api")

Rank = Annotated[int, Query(ge=0, le=INT64_MAX)]
MaxSteps = Annotated[int, Query(ge=1, le=10_000)]
From = Annotated[int | None, Query(alias="from", ge=0, le=INT64_MAX)]
To = Annotated[int | None, Query(alias="to", ge=0, le=INT64_MAX)]


@depth_router.get("/runs/{run_id}/depth", summary="The depth x step matrix of one stack")
async def depth(
    run_id: str,
    state: Viewer,
    stack: Annotated[str, Query(max_length=m.MAX_NAME_CHARS)],
    rank: Rank = 0,
    max_steps: MaxSteps = 500,
    start: From = None,
    stop: To = None,
) -> Response:
    return json_response(
        await _read(depth_matrix, state.store, run_id, stack, rank=rank, max_steps=max_steps,
                    start=start, stop=stop)
    )


@depth_router.get("/runs/{run_id}/update_ratios", summary="Update-to-weight ratios per block")
async def update_ratios(
    run_id: str,
    state: Viewer,
    rank: Rank = 0,
    max_steps: MaxSteps = 500,
    start: From = None,
    stop: To = None,
) -> Response:
    return json_response(
        await _read(update_ratio_blocks, state.store, run_id, rank=rank, max_steps=max_steps,
                    start=start, stop=stop)
    )
