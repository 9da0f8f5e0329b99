"""One REST request cannot take gigabytes: answers are capped in values (issue 18,
item 6). A real server, a real run with long series."""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from typing import Any

STEPS = 300
TIMESTEPS = 8000  # 2.4 million values in all, over the 1 million cap


def step(i: int) -> dict[str, Any]:
    values = struct.pack(f"<{TIMESTEPS}d", *(float(i * TIMESTEPS + t) for t in range(TIMESTEPS)))
    return {"kind": "step", "step": i, "loss": 1.0,
            "timesteps": {"lstm1": {"input": {"f64": base64.b64encode(values).decode()}}}}


def test_the_timestep_axis_is_downsampled_to_the_cell_cap(
    gradwatch_server: Callable[..., Any], wire: Any
) -> None:
    server = gradwatch_server()
    run_id = wire.run_id()
    for first in range(0, STEPS, 50):
        wire.send_run(server, run_id, [[step(i)] for i in range(first, first + 50)],
                      first_seq=first)
    heat = wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module=lstm1&max_steps=100000")
    assert heat["steps"] == list(range(STEPS))
    assert heat["max_timesteps"] == TIMESTEPS
    index = heat["timestep_index"]
    assert index[0] == 0 and index[-1] == TIMESTEPS - 1 and index == sorted(set(index))
    assert sum(len(row) for row in heat["values"]) <= 1_000_000
    for i in (0, 137, STEPS - 1):  # each kept value is the one at its index
        assert heat["values"][i] == [float(i * TIMESTEPS + t) for t in index]
    small = wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module=lstm1&max_steps=5")
    assert "timestep_index" not in small and len(small["values"][0]) == TIMESTEPS
    capped = wire.get_ok(
        server, f"/api/runs/{run_id}/timesteps?module=lstm1&max_steps=100&max_cells=1000"
    )
    assert [len(row) for row in capped["values"]] == [10] * 100


def test_too_many_points_are_refused_with_the_limit(
    gradwatch_server: Callable[..., Any], wire: Any
) -> None:
    server = gradwatch_server()
    run_id = wire.run_id()
    wire.send_run(server, run_id, [[wire.step(0)]])
    fields = ",".join(["loss", "total_norm", "rss_bytes"])
    status, body, headers = wire.get(
        server, f"/api/runs/{run_id}/steps?fields={fields}&max_points=1000000"
    )
    assert status == 422 and headers["content-type"].startswith("application/json")
    assert "at most 1,000,000 values" in body["detail"] and "3 x 1,000,000" in body["detail"]
    status, body, _ = wire.get(
        server, f"/api/runs/{run_id}/timesteps?module=lstm1&max_cells=1000000000"
    )
    assert status == 422 and "1000000" in str(body)
    one = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=loss&max_points=1000000")
    assert one["fields"]["loss"]["step"] == [0]



def test_every_field_of_a_run_fits_the_limit_with_fewer_points_each(
    gradwatch_server: Callable[..., Any], wire: Any
) -> None:
    """Without fields= (the run view's request) every field of the run comes, at most
    1,000,000 values in all: each gets fewer points, and the answer says how many."""
    server = gradwatch_server()
    run_id = wire.run_id()
    steps = 2600  # x 400-odd fields: over 1,000,000 values
    wire.send_run(server, run_id, [[wire.step(i, params=400, length=2) for i in range(s, s + 200)]
                                   for s in range(0, steps, 200)])
    fits = wire.get_ok(server, f"/api/runs/{run_id}/steps?max_points=2000")
    fields = len(fits["fields"])
    assert fields > 400 and fits["max_points"] == 2000 and fits["downsampled"]
    asked = 4000
    answer = wire.get_ok(server, f"/api/runs/{run_id}/steps?max_points={asked}")
    assert answer["max_points"] == 1_000_000 // fields < asked and answer["downsampled"]
    assert sum(len(f["value"]) for f in answer["fields"].values()) <= 1_000_000
    assert answer["total"] == steps and answer["fields"]["loss"]["step"][-1] == steps - 1
    named = ",".join(fits["fields"])
    status, body, _ = wire.get(server, f"/api/runs/{run_id}/steps?fields={named}&max_points="
                               f"{asked}")
    assert status == 422 and f"{fields} x {asked:,}" in body["detail"]
