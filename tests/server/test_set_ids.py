"""A run's series and rollup sets (store/chunk_writes.py ``_set_ids_of``), made in a few
statements by whichever writer sees them first: two PostgreSQL replicas writing the
same run and rank at once (a trainer that reconnected to the other one) both commit,
never deadlock, agree on every id, and the history reads back every value."""

from __future__ import annotations

import json
import random
import threading
import uuid
from typing import Any

import pytest

from gradwatch.protocol.columns import to_columns
from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store

pytestmark = pytest.mark.postgres


def _batch(run: str, seq: int, rng: random.Random, columns: bool) -> Any:
    """Steps 10*seq .. 10*seq+9 with scalars in three name sets (they differ by batch
    parity: a new set may come with any batch) and plain fields."""
    names = [f"layer{i}.weight" for i in range(rng.randrange(3, 9))]
    if seq % 2:
        names.append("head.bias")
    records = [
        {
            "kind": "step",
            "step": 10 * seq + i,
            "loss": rng.random(),
            "graph_nodes": rng.randrange(100),
            "param_norms": {n: rng.random() for n in names},
            "gate_norms": {"lstm": {g: rng.random() for g in "ifgo"}},
        }
        for i in range(10)
    ]
    message: dict[str, Any] = {"type": "batch", "run_id": run, "rank": 0, "seq": seq}
    if columns:
        message["records"], message["columns"] = to_columns(records)
    else:
        message["records"] = records
    return parse_message(json.dumps(message)), records


def _send(
    store: Any, batches: list[Any], side: int, start: threading.Barrier, results: list[Any]
) -> None:
    """Replica ``side`` takes every other batch, all at once, as its trainer sends them."""
    start.wait(timeout=30)
    futures = [
        store.submit_batch(message, f"session-{side}")
        for seq, (message, _) in enumerate(batches)
        if seq % 2 == side
    ]
    results[side] = [f.result(timeout=60) for f in futures]


def test_two_replicas_making_one_runs_sets_at_once_agree(
    shared_schema: tuple[str, str],
) -> None:
    url, _ = shared_schema
    stores = [open_store(Settings(db=url)), open_store(Settings(db=url))]
    rng = random.Random(11)
    try:
        for round_ in range(4):
            run = f"race-{round_}-{uuid.uuid4().hex[:6]}"
            hello = {"type": "hello", "protocol": 1, "run_id": run}
            for store in stores:
                store.submit_hello(parse_message(json.dumps(hello))).result(timeout=60)
            batches = [_batch(run, seq, rng, columns=seq % 3 != 0) for seq in range(8)]
            start = threading.Barrier(2)
            results: list[list[Any]] = [[], []]
            threads = [
                threading.Thread(target=_send, args=(stores[side], batches, side, start, results))
                for side in (0, 1)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            assert results == [[True] * 4, [True] * 4]

            every = [r for _, records in batches for r in records]
            fields = ["loss", "param_norms/head.bias", "gate_norms/lstm/o"]
            fields += [f"param_norms/layer{i}.weight" for i in range(3)]
            for reader in stores:
                got = reader.steps(run, fields=fields)["fields"]
                assert got["loss"]["value"] == [r["loss"] for r in every]
                assert got["gate_norms/lstm/o"]["value"] == [
                    r["gate_norms"]["lstm"]["o"] for r in every
                ]
                odd = [r for r in every if "head.bias" in r["param_norms"]]
                assert got["param_norms/head.bias"] == {
                    "step": [r["step"] for r in odd],
                    "value": [r["param_norms"]["head.bias"] for r in odd],
                }
                assert got["param_norms/layer2.weight"]["value"] == [
                    r["param_norms"]["layer2.weight"] for r in every
                ]
        sets = stores[0].query("SELECT digest, COUNT(*) FROM rollup_sets GROUP BY digest")
        assert sets and all(count == 1 for _, count in sets)
        members = stores[0].query(
            "SELECT m.set_id, COUNT(*), MAX(m.position) FROM rollup_members m GROUP BY m.set_id"
        )
        assert all(count == top + 1 for _, count, top in members)  # no gaps, no repeats
    finally:
        for store in stores:
            store.close()
