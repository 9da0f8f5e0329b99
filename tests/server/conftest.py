"""Helpers for the server tests: protocol messages as a trainer builds them, a raw
websocket trainer, and JSON over HTTP. Exposed as the `wire` fixture."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect


class Wire:
    """Builds protocol v1 messages and talks to a real server."""

    @staticmethod
    def run_id() -> str:
        return str(uuid.uuid4())

    @staticmethod
    def hello(
        run_id: str, run: str = "test-run", rank: int = 0, world_size: int = 1
    ) -> dict[str, Any]:
        return {
            "type": "hello",
            "protocol": 1,
            "run_id": run_id,
            "run": run,
            "rank": rank,
            "world_size": world_size,
            "host": "test-box",
            "pid": 4242,
            "model": {
                "modules": [{"name": "lstm1", "type": "LSTM"}, {"name": "lstm2", "type": "GRU"}],
                "parameters": 1000,
                "recurrent": ["lstm1", "lstm2"],
            },
            "config": {"every": 1},
        }

    @staticmethod
    def step(
        step: int,
        length: int = 16,
        params: int = 4,
        rng: random.Random | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """A step record like the hooks emit: 2 recurrent modules, `params` parameter norms."""
        rng = rng or random.Random(step)
        record: dict[str, Any] = {
            "kind": "step",
            "step": step,
            "epoch": step // 100,
            "t": 1_764_460_000.0 + step,
            "duration_s": 0.01 + rng.random() * 1e-3,
            "loss": 1.0 / (step + 1),
            "timesteps": {
                "lstm1": {"input": [rng.random() * 10.0**-k for k in range(length)]},
                "lstm2": {"input": [rng.random() for _ in range(length)]},
            },
            "param_norms": {f"lstm1.weight_{j}": rng.random() for j in range(params)},
            "gate_norms": {"lstm1.weight_hh_l0": {"i": 0.1, "f": 0.2, "g": 0.3, "o": 0.4}},
            "total_norm": rng.random(),
            "graph_nodes": 100 + step,
            "rss_bytes": 10_000_000,
            "overhead": 0.01,
        }
        record.update(fields)
        return record

    @staticmethod
    def batch(
        run_id: str, seq: int, records: list[dict[str, Any]], rank: int = 0
    ) -> dict[str, Any]:
        return {"type": "batch", "run_id": run_id, "rank": rank, "seq": seq, "records": records}

    @staticmethod
    def connect(
        server: Any, path: str = "/ws/ingest", token: str | None = None, **kwargs: Any
    ) -> ClientConnection:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        return connect(
            server.url + path, additional_headers=headers, open_timeout=30, max_size=None, **kwargs
        )

    @staticmethod
    def recv(ws: ClientConnection, timeout: float = 30.0) -> dict[str, Any]:
        return dict(json.loads(ws.recv(timeout=timeout)))

    def send_run(
        self,
        server: Any,
        run_id: str,
        batches: list[list[dict[str, Any]]],
        token: str | None = None,
        first_seq: int = 0,
    ) -> list[dict[str, Any]]:
        """hello, then every batch pipelined, then wait for all acks; returns the acks."""
        with self.connect(server, token=token) as ws:
            ws.send(json.dumps(self.hello(run_id)))
            for i, records in enumerate(batches):
                ws.send(json.dumps(self.batch(run_id, first_seq + i, records)))
            return [self.recv(ws) for _ in batches]

    def expect_error(self, ws: ClientConnection) -> tuple[dict[str, Any], int | None, str]:
        """The error message, then the close code and reason the server sent."""
        from websockets.exceptions import ConnectionClosed

        message = self.recv(ws)
        try:
            extra = ws.recv(timeout=30)
            raise AssertionError(f"expected the server to close, got another message {extra!r}")
        except ConnectionClosed as closed:
            rcvd = closed.rcvd
        return message, (rcvd.code if rcvd else None), (rcvd.reason if rcvd else "")

    @staticmethod
    def get(
        server: Any, path: str, token: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        """(status, parsed JSON or text, headers) of a GET on the real server."""
        request = urllib.request.Request(server.http + path, headers=dict(headers or {}))  # noqa: S310
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
                status, body, hdrs = answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as error:
            status, body, hdrs = error.code, error.read(), dict(error.headers)
        try:
            return status, json.loads(body), {k.lower(): v for k, v in hdrs.items()}
        except ValueError:
            return status, body.decode(errors="replace"), {k.lower(): v for k, v in hdrs.items()}

    def get_ok(self, server: Any, path: str, token: str | None = None) -> Any:
        status, body, _ = self.get(server, path, token)
        assert status == 200, (path, status, body)
        return body


@pytest.fixture
def wire() -> Wire:
    return Wire()


class StoreSQL:
    """A store opened in the test's process (no server), batches sent straight to it,
    and SQL run beside it on a connection of its own (SQLite file or PostgreSQL URL)."""

    @staticmethod
    def open(db: str, run: str) -> Any:
        from gradwatch.server.schema import parse_message
        from gradwatch.server.settings import Settings
        from gradwatch.server.store import open_store

        store = open_store(Settings(db=db))
        hello = {"type": "hello", "protocol": 1, "run_id": run}
        store.submit_hello(parse_message(json.dumps(hello))).result()
        return store

    @staticmethod
    def send(
        store: Any, run: str, seq: int, records: list[dict[str, Any]], session: str = ""
    ) -> None:
        from gradwatch.server.schema import parse_message

        batch = {"type": "batch", "run_id": run, "rank": 0, "seq": seq, "records": records}
        assert store.submit_batch(parse_message(json.dumps(batch)), session).result()

    @staticmethod
    def execute(db: str, statements: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Runs SQL ("?" placeholders) on its own connection; the last statement's rows."""
        found: list[Any] = []
        if db.startswith("postgresql"):
            import psycopg

            with psycopg.connect(db, autocommit=True) as conn:
                for sql, params in statements:
                    cur = conn.execute(sql.replace("?", "%s"), params)
                    found = cur.fetchall() if cur.description else []
            return found
        import sqlite3

        conn = sqlite3.connect(db)
        try:
            for sql, params in statements:
                found = conn.execute(sql, params).fetchall()
            conn.commit()
        finally:
            conn.close()
        return found


@pytest.fixture
def store_sql() -> type[StoreSQL]:
    return StoreSQL


@pytest.fixture
def shared_schema(postgres_url: str) -> Iterator[tuple[str, str]]:
    """(database URL on a fresh schema, schema name), for several servers (or workers)
    to share; dropped afterwards."""
    import psycopg

    schema = "gw_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in postgres_url else "?"
    yield f"{postgres_url}{sep}options=-csearch_path%3D{schema}", schema
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
