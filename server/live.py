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
(``server/columns.records_json`` builds it so).

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

# The channel of viewers that watch the run list rather than one run.
RUNS_CHANNEL = ""


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
        """Hand ``text`` to every viewer of ``channel``; never waits."""
        for viewer in tuple(self._channels.get(channel, ())):
            viewer.offer(text)
            if viewer.out:
                self.unsubscribe(viewer)
