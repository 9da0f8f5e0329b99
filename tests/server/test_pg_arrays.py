"""server/pg_arrays.py against a real PostgreSQL: each array built a column at a time
reads back as the values it was built from, and as psycopg's own dumping of the same
list would send them; one of another element type is refused, not misread."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gradwatch.server import pg_arrays
from gradwatch.server.pg_arrays import binary_array

pytestmark = pytest.mark.postgres


@pytest.fixture
def conn(postgres_url: str) -> Iterator[Any]:
    import psycopg

    with psycopg.connect(postgres_url) as connection:
        pg_arrays.register(connection.adapters)
        yield connection


def _plain(value: Any) -> Any:
    """What PostgreSQL gives back for a value sent in a column."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


rng = random.Random(7)
CASES: list[tuple[str, list[Any]]] = [
    ("int8", [0, 1, -1, 2**63 - 1, -(2**63), 1_700_000_000_123, np.int64(-5)]),
    ("int8", [rng.randrange(-(2**40), 2**40) for _ in range(1000)]),
    ("int8", [3, None, None, 4]),
    ("int8", []),
    ("text", ["run-a", "é€😀", "", "a'b\"c\\d", "x" * 5000, None]),
    ("text", [f"param_norms/layer{i}.weight" for i in range(200)]),
    ("bytea", [b"", b"\x00\x01\xff", bytearray(b"ab"), memoryview(b"xyz"), None]),
    ("bytea", [rng.randbytes(rng.randrange(0, 300_000)) for _ in range(4)]),
    ("bool", [True, False, True]),
    ("bool", [False, None]),
]


@pytest.mark.parametrize(("kind", "values"), CASES, ids=[f"{k}-{len(v)}" for k, v in CASES])
def test_an_array_reads_back_as_the_values_it_was_built_from(
    conn: Any, kind: str, values: list[Any]
) -> None:
    got = conn.execute(f"SELECT %b::{kind}[]", [binary_array(kind, values)]).fetchone()[0]
    assert got == [_plain(v) for v in values]
    plain = [_plain(v) for v in values]
    if plain:  # psycopg's element-by-element dumping: the same array on the server
        same = conn.execute(
            f"SELECT %b::{kind}[] = %s::{kind}[]", [binary_array(kind, values), plain]
        ).fetchone()[0]
        assert same is True


def test_columns_unnest_into_rows_in_order(conn: Any) -> None:
    rows = [(f"run{i % 3}", i * 7 - 20, bytes([i]) * i, i % 2 == 0) for i in range(50)]
    kinds = ("text", "int8", "bytea", "bool")
    arrays = [binary_array(k, c) for k, c in zip(kinds, zip(*rows, strict=True), strict=True)]
    got = conn.execute(
        "SELECT * FROM unnest(%b::text[], %b::int8[], %b::bytea[], %b::bool[])", arrays
    ).fetchall()
    assert got == rows


def test_an_array_cast_to_another_element_type_is_refused_by_the_server(conn: Any) -> None:
    import psycopg

    with pytest.raises(psycopg.errors.DatatypeMismatch, match="element type 20"):
        conn.execute("SELECT %b::text[]", [binary_array("int8", [1, 2])])


def test_a_value_of_the_wrong_type_is_refused_before_it_is_sent() -> None:
    with pytest.raises((TypeError, ValueError)):
        binary_array("int8", [1, "two"])
    with pytest.raises(KeyError):
        binary_array("float4", [1.0])
