"""The sender's small parts: backoff, URL rules, the outbox's order and spool, warn-once."""

from __future__ import annotations

import random
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from gradwatch.protocol.backoff import Backoff
from gradwatch.protocol.outbox import Outbox
from gradwatch.protocol.spool import read_spool
from gradwatch.protocol.warnings import GradwatchWarning, WarnOnce
from gradwatch.protocol.wsclient import ingest_url


def test_backoff_is_exponential_full_jitter_and_capped() -> None:
    backoff = Backoff(base=0.1, cap=2.0, rng=random.Random(7).uniform)
    bounds, delays = [], []
    for _ in range(12):
        bounds.append(backoff.bound())
        delays.append(backoff.next_delay())
    assert bounds[:6] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0])
    assert max(bounds) == 2.0
    assert all(0.0 <= d <= b for d, b in zip(delays, bounds, strict=True))
    assert len(set(delays)) == len(delays)  # jittered, not a fixed schedule
    backoff.reset()
    assert backoff.bound() == pytest.approx(0.1)
    long = Backoff(base=0.05, cap=5.0)  # a very long outage must not overflow
    long.attempts = 10_000
    assert long.bound() == 5.0


def test_backoff_leaves_the_programs_random_stream_alone() -> None:
    """Reconnect jitter draws from a generator of its own: a training program that
    seeds `random` gets the same numbers whether or not gradwatch reconnected."""
    random.seed(11)
    expected = [random.random() for _ in range(3)]
    random.seed(11)
    backoff = Backoff(base=0.1, cap=2.0)
    delays = [backoff.next_delay() for _ in range(6)]
    assert [random.random() for _ in range(3)] == expected
    assert all(0.0 <= d <= 2.0 for d in delays) and len(set(delays)) == 6


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="expected 0 < base <= cap, got base=0, cap=1"):
        Backoff(base=0, cap=1)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("ws://127.0.0.1:8765", "ws://127.0.0.1:8765/ws/ingest"),
        ("ws://127.0.0.1:8765/", "ws://127.0.0.1:8765/ws/ingest"),
        ("wss://box.example:443", "wss://box.example:443/ws/ingest"),
        ("http://gpu-box:8765", "ws://gpu-box:8765/ws/ingest"),
        ("https://gpu-box", "wss://gpu-box/ws/ingest"),
        ("ws://h:1/proxy/ws/ingest", "ws://h:1/proxy/ws/ingest"),
        ("ws://h:1?token=x", "ws://h:1/ws/ingest?token=x"),
    ],
)
def test_ingest_url(given: str, expected: str) -> None:
    assert ingest_url(given) == expected


@pytest.mark.parametrize("bad", ["127.0.0.1:8765", "ftp://h", "ws://", ""])
def test_ingest_url_says_what_it_expected(bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape("expected a server URL such as 'ws://127.0.0.1:8765'")):
        ingest_url(bad)


def hello() -> dict[str, Any]:
    return {"type": "hello", "protocol": 1, "run_id": "r", "rank": 0}


def test_outbox_keeps_seq_order_across_memory_and_disk(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "s.jsonl", hello(), window_batches=2, max_batch_bytes=1)
    box.add('{"n":0}', 1, direct=True)
    box.add('{"n":1}', 1, direct=True)
    box.add('{"n":2}', 1, direct=True)  # window full: to disk
    box.add('{"n":3}', 1, direct=True)  # disk not empty: to disk too, after it
    assert [b.seq for b in box.memory] == [0, 1] and [s for s, _, _ in box.disk] == [2, 3]
    sent = [box.next_to_send(), box.next_to_send(), box.next_to_send()]
    assert [b.seq if b else None for b in sent] == [0, 1, None]  # window of 2 in flight
    assert box.ack(0) and not box.ack(0)  # a repeated ack changes nothing
    nxt = box.next_to_send()
    assert nxt is not None and (nxt.seq, nxt.from_disk) == (2, True)
    box.restart()  # reconnect: everything unacknowledged again, oldest first
    again = [box.next_to_send() for _ in range(3)]
    assert [b.seq if b else None for b in again] == [1, 2, None]
    for seq in (1, 2):
        box.ack(seq)
    last = box.next_to_send()
    assert last is not None and last.seq == 3
    assert (tmp_path / "s.jsonl").exists()
    box.ack(3)
    assert box.empty and not (tmp_path / "s.jsonl").exists()  # all acked: spool removed


def test_outbox_merges_only_batches_not_yet_sent(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "s.jsonl", hello())
    box.add('{"n":0}', 1, direct=True)
    box.add('{"n":1}', 1, direct=True)
    first = box.next_to_send()
    assert first is not None and first.nrecords == 2
    assert (
        first.text == '{"type":"batch","run_id":"r","rank":0,"seq":0,"records":[{"n":0},{"n":1}]}'
    )
    box.add('{"n":2}', 1, direct=True)  # the sent batch is sealed: a new one
    second = box.next_to_send()
    assert second is not None and (second.seq, second.nrecords) == (1, 1)


def test_outbox_persist_writes_hello_then_unacked_in_order(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    box = Outbox(path, hello(), window_batches=2, max_batch_bytes=1)
    for n in range(5):
        box.add(f'{{"n":{n}}}', 1, direct=n < 2)
    box.next_to_send()
    box.ack(0)
    assert box.persist() == (4, 4)
    messages = list(read_spool(path))
    assert messages[0] == hello()
    assert [(m["seq"], m["records"]) for m in messages[1:]] == [
        (n, [{"n": n}]) for n in range(1, 5)
    ]


def test_warn_once_per_kind_and_survives_warnings_as_errors() -> None:
    once = WarnOnce()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert once.warn("a", "first a")
        assert not once.warn("a", "second a")
        assert once.warn("b", "first b")
    assert [str(w.message) for w in caught] == ["first a", "first b"]
    assert all(w.category is GradwatchWarning for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert WarnOnce().warn("c", "must not raise")  # a background thread must survive
