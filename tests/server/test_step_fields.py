"""The optional step fields `backward_passes`, `timestep_layout` and `same_input`
(docs/PROTOCOL.md)."""

from __future__ import annotations

import json

import pytest

from gradwatch.server.schema import parse_message
from gradwatch.server.schema_errors import ProtocolError


def batch(**fields: object) -> str:
    record = {"kind": "step", "step": 4, **fields}
    return json.dumps({"type": "batch", "run_id": "r", "rank": 0, "seq": 0, "records": [record]})


@pytest.mark.parametrize(
    "fields",
    [
        {"backward_passes": 1},
        {"backward_passes": 20},
        {"timestep_layout": {"encoder.cell": "chain", "tree.cell": "tree"}},
        {"backward_passes": 3, "timestep_layout": {}},
        # profile=True's same_input (a newer trainer's field): kept as it came
        {"same_input": {"decoder.attention.Ua": {"args": ["input"], "of": 1, "calls": 10,
                                                 "from": {"input": "decoder.attention:keys"}}}},
    ],
)
def test_valid_values_are_taken_as_sent(fields: dict[str, object]) -> None:
    (record,) = parse_message(batch(**fields)).records
    assert record.model_dump(exclude_unset=True) == {"kind": "step", "step": 4, **fields}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backward_passes": 0},
         "records[0].backward_passes: expected greater than or equal to 1, got 0"),
        ({"backward_passes": True},
         "records[0].backward_passes: expected a valid integer, got True"),
        ({"backward_passes": 2.0},
         "records[0].backward_passes: expected a valid integer, got 2.0"),
        ({"timestep_layout": {"cell": "loop"}},
         "records[0].timestep_layout.cell: expected 'chain' or 'tree', got 'loop'"),
        ({"timestep_layout": ["tree"]},
         "records[0].timestep_layout: expected an object, got ['tree']"),
    ],
)
def test_bad_values_are_refused_with_what_was_expected(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_message(batch(**fields))
    assert caught.value.code == 1007
    assert caught.value.message.startswith(message), caught.value.message


def test_the_server_stores_them_and_the_api_returns_them(gradwatch_server, gradwatch_db, wire):
    """`backward_passes` reads back as a field of /steps (steps without it: no point),
    and each heatmap row of /timesteps says its module's `timestep_layout` (absent:
    chain), beside steps of other shapes in the same batches."""
    server = gradwatch_server(db=gradwatch_db)
    run_id = wire.run_id()
    records = [wire.step(s, length=4) for s in range(6)]
    records[1]["backward_passes"] = 4
    records[2]["backward_passes"] = 2
    records[2]["timestep_layout"] = {"lstm1": "tree", "lstm2": "chain"}
    records[4]["timestep_layout"] = {"lstm2": "tree"}
    records[5]["nonfinite"] = {"loss": True}
    acks = wire.send_run(server, run_id, [records[:3], records[3:]])
    assert [a["seq"] for a in acks] == [0, 1]
    steps = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=backward_passes,loss")
    assert steps["fields"]["backward_passes"] == {"step": [1, 2], "value": [4, 2]}
    assert steps["fields"]["loss"]["step"] == list(range(6))
    for module, want in (
        ("lstm1", ["chain", "chain", "tree", "chain", "chain", "chain"]),
        ("lstm2", ["chain", "chain", "chain", "chain", "tree", "chain"]),
    ):
        heat = wire.get_ok(server, f"/api/runs/{run_id}/timesteps?module={module}&series=input")
        assert heat["steps"] == list(range(6))
        assert heat["layout"] == want, module
    # Listed among the run's fields, so the dashboard's default query includes it.
    assert "backward_passes" in wire.get_ok(server, f"/api/runs/{run_id}/steps")["fields"]
