"""Live fan-out: every viewer has its own bounded queue, so none can slow ingest.

Ingest publishes a message (already encoded JSON text, encoded once for every
viewer) after the batch is committed. ``publish`` never waits: when a viewer's queue
is full its oldest message is dropped and the viewer is told, before its next
message, ``{"type": "lagged", "dropped": n}``. A viewer is also bounded in bytes
(``Settings.live_queue_bytes``): one whose queue would pass that has fallen behind for
good (it does not read, or reads slower than the run is written). It is dropped: its
queue is released at once, and its connection gets ``{"type": "lagged", "dropped":
n, "closed": true}`` if the socket still takes it, then is aborted
(server/viewers.py), so a viewer that never reads pins a bounded amount of memory.

A ``records`` message reaches viewers with its step records in step order
(:func:`in_step_order`, once per message, not per viewer).

Example:
    >>> import asyncio
    >>> async def demo():
    ...     hub = Hub(queue_size=2)
    ...     viewer = hub.subscribe("run-1")
    ...     for i in range(3):
    ...         hub.publish("run-1", f'{{"n": {i}}}')
    ...     got = [await viewer.next(), await viewer.next(), await viewer.next()]
    ...     hub.unsubscribe(viewer)
    ...     return got
    >>> asyncio.run(demo())
    ['{"type":"lagged","dropped":1}', '{"n": 1}', '{"n": 2}']
"""

from __future__ import annotations

import asyncio
from itertools import pairwise
from operator import itemgetter
from typing import Any

from pydantic_core import from_json

from gradwatch.protocol.codec import dumps

# The channel of viewers that watch the run list rather than one run.
RUNS_CHANNEL = ""
# How ingest and the replica feed begin a batch's live message (codec.dumps, compact).
_RECORDS_HEAD = '{"type":"records",'


def _step_slots(records: list[Any]) -> list[int]:
    """Where the step records with an integer step are in ``records``."""
    return [
        i
        for i, r in enumerate(records)
        if isinstance(r, dict) and r.get("kind") == "step" and type(r.get("step")) is int
    ]


def in_step_order(text: str) -> str:
    """A ``records`` message with its step records in step order; any other message,
    or one already in order, unchanged.

    The trainer hands its sender records in step order, but a batch carries its step
    records in two parts (docs/PROTOCOL.md, ``columns``): those a block cannot hold
    (a heavy step's) in ``records``, the others in blocks grouped by shape, and the
    message rebuilt for viewers lists ``records`` first. So a heavy step came before
    the light steps just before it (steps 3, 2, 4, 5), and a chart that draws in
    arrival order drew them out of order. Only the step records move, among their own
    places (a stable sort: two records of one step keep their stored order); alerts,
    epochs and ends stay where they are.

    Done here, where ingest and the replica feed both publish, while the run has
    viewers: a parse of each message (~4 ms a MB on a 2-core VM), and an encode only
    of one out of order.

    >>> in_step_order('{"type":"records","records":[{"kind":"step","step":3},'
    ...               '{"kind":"alert","step":3},{"kind":"step","step":2}]}')
    '{"type":"records","records":[{"kind":"step","step":2},{"kind":"alert","step":3},{"kind":"step","step":3}]}'
    """
    if not text.startswith(_RECORDS_HEAD):
        return text
    try:
        message = from_json(text)
        records = message["records"]
        slots = _step_slots(records)
    except (ValueError, KeyError, TypeError):  # not ours to judge: passed on as it came
        return text
    steps = [records[i]["step"] for i in slots]
    if all(a <= b for a, b in pairwise(steps)):
        return text  # in order already: not encoded again
    ordered = sorted((records[i] for i in slots), key=itemgetter("step"))
    for i, record in zip(slots, ordered, strict=True):
        records[i] = record
    return dumps(message)


class Viewer:
    """One subscriber: a queue bounded in messages and in bytes, and what it missed."""

    __slots__ = ("channel", "dropped", "gone", "max_bytes", "out", "queue", "queued_bytes")

    def __init__(self, channel: str, size: int, max_bytes: int = 16 << 20) -> None:
        self.channel = channel
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=size + 1)
        self.dropped = 0
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self.out = False  # dropped for falling behind; None in the queue ends it
        self.gone = asyncio.Event()  # set with `out`: its connection ends now

    def offer(self, text: str) -> None:
        """Queue ``text`` without waiting; drop the oldest message when full, or the
        viewer itself when its queue would pass ``max_bytes``."""
        if self.out:
            return
        if self.queued_bytes + len(text) > self.max_bytes:
            self.dropped += 1  # this message, and all queued ones below
            self._fall_out()
            return
        while self.queue.qsize() >= self.queue.maxsize - 1:
            old = self.queue.get_nowait()
            self.dropped += 1
            self.queued_bytes -= len(old or "")
        self.queue.put_nowait(text)
        self.queued_bytes += len(text)

    def _fall_out(self) -> None:
        self.out = True
        self.gone.set()
        while not self.queue.empty():
            self.queue.get_nowait()
            self.dropped += 1
        self.queued_bytes = 0
        self.queue.put_nowait(None)

    def notice(self) -> str | None:
        """The ``lagged`` notice due now, or None (taken by :meth:`next` too)."""
        if not self.dropped:
            return None
        dropped, self.dropped = self.dropped, 0
        if self.out:
            return f'{{"type":"lagged","dropped":{dropped},"closed":true}}'
        return f'{{"type":"lagged","dropped":{dropped}}}'

    async def next(self) -> str | None:
        """The next message to send, a ``lagged`` notice first when some were dropped;
        None once the viewer is dropped (after its last ``lagged`` notice)."""
        notice = self.notice()
        if notice is not None:
            return notice
        text = await self.queue.get()
        if text is not None:
            self.queued_bytes -= len(text)
        return text


class Hub:
    """Subscriptions per channel (a run id, or :data:`RUNS_CHANNEL` for the run list)."""

    def __init__(self, queue_size: int = 256, queue_bytes: int = 16 << 20) -> None:
        self.queue_size = queue_size
        self.queue_bytes = queue_bytes
        self._channels: dict[str, set[Viewer]] = {}

    def subscribe(self, channel: str) -> Viewer:
        viewer = Viewer(channel, self.queue_size, self.queue_bytes)
        self._channels.setdefault(channel, set()).add(viewer)
        return viewer

    def unsubscribe(self, viewer: Viewer) -> None:
        viewers = self._channels.get(viewer.channel)
        if viewers is not None:
            viewers.discard(viewer)
            if not viewers:
                del self._channels[viewer.channel]

    def has_viewers(self, channel: str) -> bool:
        return bool(self._channels.get(channel))

    def viewer_count(self) -> int:
        return sum(len(v) for v in self._channels.values())

    def channels(self) -> list[str]:
        """The channels that have viewers now."""
        return list(self._channels)

    def lag(self, channel: str) -> None:
        """Tell the viewers of ``channel`` that live messages were lost elsewhere (another
        replica's batches that could not be read back): ``lagged`` with ``dropped`` 1, a
        lower bound, so that they refetch history."""
        self.publish(channel, '{"type":"lagged","dropped":1}')

    def publish(self, channel: str, text: str) -> None:
        """Hand ``text`` to every viewer of ``channel`` (a ``records`` message in step
        order); never waits."""
        viewers = tuple(self._channels.get(channel, ()))
        if viewers:
            text = in_step_order(text)
        for viewer in viewers:
            viewer.offer(text)
            if viewer.out:
                self.unsubscribe(viewer)
