"""Property test of the sender's outbox: whatever the interleaving of sends, sends on
the wire, acks (repeats included), reconnects and refusals, no record is lost, none is
duplicated, batches go out in seq order, and memory stays within the window."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gradwatch.protocol.outbox import Outbox
from gradwatch.protocol.spool import read_spool

HELLO = {"type": "hello", "protocol": 1, "run_id": "r", "rank": 0}

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 3), st.booleans()),
        st.tuples(st.just("add_block"), st.integers(1, 3), st.booleans()),  # as `columns`
        st.tuples(st.just("send"), st.integers(1, 4), st.booleans()),
        st.tuples(st.just("ack"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("restart"), st.just(0), st.booleans()),
        st.tuples(st.just("reject"), st.just(0), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, window=st.integers(1, 4), merge=st.booleans())
def test_outbox_never_loses_duplicates_or_reorders(
    ops: list[tuple[str, int, bool]], window: int, merge: bool
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "s.jsonl"
        box = Outbox(path, HELLO, window_batches=window, max_batch_bytes=4096 if merge else 1)
        added: list[int] = []
        blocks: set[int] = set()  # ids added as `columns`
        batches: dict[int, list[int]] = {}  # seq -> record ids, as they went on the wire
        acked: set[int] = set()
        rejected: set[int] = set()
        in_flight: list[int] = []  # sent on this connection, in order
        for op, n, flag in ops:
            if op == "add":
                ids = list(range(len(added), len(added) + n))
                added.extend(ids)
                for i in ids:
                    box.add(json.dumps({"id": i}), 1, direct=flag)
            elif op == "add_block":
                ids = list(range(len(added), len(added) + n))
                added.extend(ids)
                blocks.update(ids)
                for i in ids:
                    box.add("", 1, direct=flag, columns=json.dumps({"id": i}))
            elif op == "send":
                for _ in range(n):
                    batch = box.next_to_send()
                    if batch is None:
                        break
                    assert batch.text is not None
                    message = json.loads(batch.text)
                    assert message["seq"] == batch.seq
                    records = [r["id"] for r in message["records"] + message.get("columns", [])]
                    # A batch's content never changes once it went out.
                    assert batches.setdefault(batch.seq, records) == records
                    assert not in_flight or batch.seq > in_flight[-1]  # seq order
                    in_flight.append(batch.seq)
            elif op == "ack" and in_flight:
                # The server acks in order; a repeat of an earlier ack may come too.
                seq = in_flight[min(n, len(in_flight) - 1)] if flag else in_flight[0]
                box.ack(seq)
                acked.add(seq)
                in_flight = [s for s in in_flight if s != seq]
            elif op == "restart":
                box.restart()
                in_flight = []
            elif op == "reject":
                batch = box.reject_oldest_sent()
                if batch is not None:
                    assert batch.seq == in_flight[0] or batch.seq not in acked
                    rejected.add(batch.seq)
                    in_flight = [s for s in in_flight if s != batch.seq]
            assert len(box.memory) <= max(window, 1)
        pending_before = box.pending_batches
        assert box.persist()[0] == pending_before
        pending: dict[int, list[int]] = {}
        if path.exists():
            messages = list(read_spool(path))
            assert messages[0] == HELLO
            seqs = [m["seq"] for m in messages[1:]]
            assert seqs == sorted(seqs) and len(seqs) == pending_before
            pending = {
                m["seq"]: [r["id"] for r in m["records"] + m.get("columns", [])]
                for m in messages[1:]
            }
        else:
            assert pending_before == 0
        # Every seq from 0 is exactly one of: acknowledged, refused, left in the spool.
        assert set(range(box.next_seq)) == acked | rejected | set(pending)
        assert not (acked & set(pending)) and not (rejected & set(pending))
        # And the records, seq by seq, are exactly what was added, in order (records
        # and columns each: a batch lists its records before its blocks).
        content: dict[int, list[int]] = {**batches, **pending}
        every = [i for seq in range(box.next_seq) for i in content.get(seq, [])]
        assert sorted(every) == added
        assert [i for i in every if i not in blocks] == [i for i in added if i not in blocks]
        assert [i for i in every if i in blocks] == [i for i in added if i in blocks]


