"""Live fan-out: every viewer has its own bounded queue, so none can slow ingest.

Ingest publishes a message (already encoded JSON text, encoded once for every
viewer) after the batch is committed. ``publish`` never waits: when a viewer's queue
is full its oldest message is dropped and the viewer is told, before its next
message, ``{"type": "lagged", "dropped": n}``.

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
    """One subscriber: a bounded queue and a count of what it missed."""

    __slots__ = ("channel", "dropped", "queue")

    def __init__(self, channel: str, size: int) -> None:
        self.channel = channel
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=size)
        self.dropped = 0

    def offer(self, text: str) -> None:
        """Queue ``text`` without waiting; drop the oldest message when full."""
        while True:
            try:
                self.queue.put_nowait(text)
                return
            except asyncio.QueueFull:
                try:
                    self.queue.get_nowait()
                    self.dropped += 1
                except asyncio.QueueEmpty:  # pragma: no cover - single-threaded loop
                    pass

    async def next(self) -> str:
        """The next message to send, a ``lagged`` notice first when some were dropped."""
        if self.dropped:
            dropped, self.dropped = self.dropped, 0
            return f'{{"type":"lagged","dropped":{dropped}}}'
        return await self.queue.get()


class Hub:
    """Subscriptions per channel (a run id, or :data:`RUNS_CHANNEL` for the run list)."""

    def __init__(self, queue_size: int = 256) -> None:
        self.queue_size = queue_size
        self._channels: dict[str, set[Viewer]] = {}

    def subscribe(self, channel: str) -> Viewer:
        viewer = Viewer(channel, self.queue_size)
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
