"""The server's pure parts: downsampling, validation messages, settings, the store
used directly (no network)."""

from __future__ import annotations

import json
import random
from concurrent.futures import wait

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradwatch.server.downsample import minmax, pick_rows
from gradwatch.server.schema import parse_message
from gradwatch.server.schema_errors import ProtocolError
from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store

numbers = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    ["NaN", "Infinity", "-Infinity"]
)


@given(values=st.lists(numbers, max_size=400), max_points=st.integers(2, 60))
def test_minmax_bounds_the_answer_and_keeps_extremes(values, max_points):
    steps = list(range(len(values)))
    out_steps, out_values = minmax(steps, values, max_points)
    assert len(out_steps) <= max_points
    assert out_steps == sorted(set(out_steps))
    assert all(values[s] == v or (v != v) for s, v in zip(out_steps, out_values, strict=True))
    finite = [v for v in values if not isinstance(v, str)]
    if finite and not any(isinstance(v, str) for v in values):
        assert max(finite) in out_values and min(finite) in out_values
    if any(isinstance(v, str) for v in values):  # every bucket with one shows one
        assert any(isinstance(v, str) for v in out_values)


def test_minmax_refuses_fewer_than_two_points():
    with pytest.raises(ValueError, match="max_points: expected at least 2, got 1"):
        minmax([0, 1, 2], [1.0, 2.0, 3.0], 1)


@given(n=st.integers(0, 5000), k=st.integers(1, 600))
def test_pick_rows_is_even_and_keeps_first_and_last(n, k):
    rows = pick_rows(n, k)
    assert len(rows) == min(n, k)
    assert rows == sorted(set(rows))
    if n:
        assert rows[-1] == n - 1
        assert k == 1 or rows[0] == 0


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        (
            '{"type":"hello","protocol":1,"run_id":"r","rank":true}',
            1007,
            "rank: expected a valid integer, got True",
        ),
        (
            '{"type":"batch","run_id":"r","rank":0,"seq":0,"records":[{"kind":"step","step":0,'
            '"param_norms":{"w":"1.5"}}]}',
            1007,
            'records[0].param_norms.w: expected a number or "NaN"/"Infinity"/"-Infinity",'
            " got '1.5'",
        ),
        (
            '{"type":"batch","run_id":"r","rank":0,"seq":0,"records":[{"kind":"alert","code":"x"}]}',
            1007,
            "records[0].code: expected 'vanishing', 'exploding'",
        ),
        ('{"type":"ping"}', 1008, "type: expected 'hello' or 'batch', got 'ping'"),
        ("[]", 1007, "expected an object, got []"),
    ],
)
def test_validation_names_the_field_and_says_expected_and_got(text, code, message):
    with pytest.raises(ProtocolError) as caught:
        parse_message(text)
    assert caught.value.code == code
    assert caught.value.message.startswith(message), caught.value.message


def test_validation_keeps_unknown_fields_and_nonfinite_strings():
    batch = parse_message(
        '{"type":"batch","run_id":"r","rank":0,"seq":3,"future":1,'
        '"records":[{"kind":"step","step":0,"loss":"-Infinity","new_metric":[1,2]}]}'
    )
    assert batch.records[0].loss == "-Infinity"
    assert batch.records[0].model_dump(exclude_unset=True) == {
        "kind": "step",
        "step": 0,
        "loss": "-Infinity",
        "new_metric": [1, 2],
    }


def test_settings_read_environment_in_one_place_and_flags_win():
    env = {
        "GRADWATCH_DB": "postgresql://u@127.0.0.1/db",
        "GRADWATCH_PORT": "9000",
        "GRADWATCH_ALLOWED_HOSTS": "lab.example, gpu.lab",
        "GRADWATCH_TOKEN": "t",
    }
    settings = Settings.from_env(env, port=9100)
    assert settings.db_kind == "postgresql"
    assert settings.port == 9100
    assert settings.token == "t"
    assert settings.host_allowed("gpu.lab") and settings.host_allowed("localhost")
    assert not settings.host_allowed("evil.example")
    with pytest.raises(ValueError, match="GRADWATCH_PORT: expected an integer, got 'x'"):
        Settings.from_env({"GRADWATCH_PORT": "x"})
    with pytest.raises(ValueError, match="sqlite_synchronous: expected NORMAL, FULL or EXTRA"):
        Settings.from_env({"GRADWATCH_SQLITE_SYNCHRONOUS": "OFF"})


def test_frame_ancestors_come_from_the_variable_and_are_checked():
    env = {"GRADWATCH_FRAME_ANCESTORS": "https://hub.lab.example, http://10.0.0.5:8888 *"}
    assert Settings.from_env(env).frame_ancestors == (
        "https://hub.lab.example", "http://10.0.0.5:8888", "*")
    assert Settings.from_env(env, frame_ancestors=("none",)).frame_ancestors == ("none",)
    assert Settings.from_env({}).frame_ancestors == ()  # the loopback defaults are added later
    with pytest.raises(ValueError, match="expected 'none' alone"):
        Settings.from_env({"GRADWATCH_FRAME_ANCESTORS": "none https://hub.lab.example"})
    for bad in ("https://hub.lab.example/", "ftp://hub", "https://h;", "https://h:99999x"):
        with pytest.raises(ValueError, match=f"expected an origin .*got {bad!r}"):
            Settings.from_env({}, frame_ancestors=(bad,))


def test_store_commits_many_batches_together_and_dedups_within_a_group(gradwatch_db):
    store = open_store(Settings(db=gradwatch_db))
    try:
        hello = parse_message(json.dumps({"type": "hello", "protocol": 1, "run_id": "g"}))
        store.submit_hello(hello).result()
        rng = random.Random(0)
        batches = [
            parse_message(
                json.dumps(
                    {
                        "type": "batch",
                        "run_id": "g",
                        "rank": 0,
                        "seq": s % 50,
                        # Steps descend: the run's last_step is the largest, not the last.
                        "records": [{"kind": "step", "step": 49 - s % 50, "loss": rng.random()}],
                    }
                )
            )
            for s in range(100)
        ]
        futures = [store.submit_batch(b) for b in batches]  # queued at once: grouped
        wait(futures, timeout=60)
        assert [f.result() for f in futures] == [True] * 50 + [False] * 50
        steps = store.steps("g", fields=["loss"])
        assert steps["fields"]["loss"]["step"] == list(range(50))
        assert store.run_summary("g")["last_step"] == 49
    finally:
        store.close()
    with pytest.raises(RuntimeError, match="the store is closed"):
        store.submit_hello(hello).result()


def test_store_downsamples_in_sql_exactly_like_the_reference(gradwatch_db):
    """The database's min/max per bucket equals downsample.minmax on the full series."""
    from hypothesis import HealthCheck, settings

    store = open_store(Settings(db=gradwatch_db))
    hello = {"type": "hello", "protocol": 1, "run_id": "ds"}
    store.submit_hello(parse_message(json.dumps(hello))).result()
    seq = iter(range(10**6))

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        steps=st.lists(st.integers(0, 5000), min_size=1, max_size=300, unique=True),
        nan_at=st.integers(0, 400),
        max_points=st.integers(2, 40),
        data=st.data(),
    )
    def check(steps, nan_at, max_points, data):
        steps = sorted(steps)
        values = data.draw(
            st.lists(st.floats(-1e9, 1e9), min_size=len(steps), max_size=len(steps), unique=True)
        )
        if nan_at < len(values):
            values[nan_at] = "NaN"
        run = f"ds-{next(seq)}"
        store.submit_hello(parse_message(json.dumps({**hello, "run_id": run}))).result()
        records = [
            {"kind": "step", "step": s, "loss": v, "param_norms": {"w": v}}
            for s, v in zip(steps, values, strict=True)
        ]
        batch = {"type": "batch", "run_id": run, "rank": 0, "seq": 0, "records": records}
        assert store.submit_batch(parse_message(json.dumps(batch))).result()
        got = store.steps(run, fields=["loss", "param_norms/w"], max_points=max_points)
        expected_steps, expected_values = minmax(steps, values, max_points)
        for name in ("loss", "param_norms/w"):
            assert got["fields"][name]["step"] == expected_steps, name
            assert got["fields"][name]["value"] == expected_values, name
        assert got["downsampled"] == (len(steps) > max_points)

    try:
        check()
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_store_reconnects_after_losing_its_connection(postgres_url):
    import psycopg

    schema = "gw_reconnect_" + str(random.randrange(10**9))
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    store = open_store(Settings(db=f"{postgres_url}?options=-csearch_path%3D{schema}"))
    try:
        hello = {"type": "hello", "protocol": 1, "run_id": "pg"}
        store.submit_hello(parse_message(json.dumps(hello))).result()

        def batch(seq):
            message = {
                "type": "batch",
                "run_id": "pg",
                "rank": 0,
                "seq": seq,
                "records": [{"kind": "step", "step": seq}],
            }
            return store.submit_batch(parse_message(json.dumps(message)))

        assert batch(0).result() is True
        assert store.steps("pg", fields=["graph_nodes"])["total"] == 1
        # The database drops the writer's and this thread's reader's connections.
        with store.reading() as reader:
            pids = (store._writer_conn.info.backend_pid, reader.info.backend_pid)
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(RuntimeError, match="OperationalError"):
            batch(1).result(timeout=60)  # not acknowledged: the trainer will resend it
        with pytest.raises(psycopg.OperationalError):
            store.steps("pg", fields=["graph_nodes"])
        assert batch(1).result(timeout=60) is True  # the resend lands on a new connection
        assert store.steps("pg", fields=["graph_nodes"])["total"] == 2
    finally:
        store.close()
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
