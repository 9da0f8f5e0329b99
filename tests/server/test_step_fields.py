"""The optional step fields `backward_passes`, `timestep_layout` and `same_input`
(docs/PROTOCOL.md)."""

from __future__ import annotations

import json

import pytest

from gradwatch.server.schema import ProtocolError, parse_message


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
