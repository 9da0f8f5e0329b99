"""Alerts leave the browser: each problem is POSTed to webhooks when raised and when cleared.

``gradwatch serve --alert-webhook URL`` (repeatable, or ``GRADWATCH_ALERT_WEBHOOK``)
sends one JSON POST per alert record whose state is ``raised`` or ``cleared``
(``updated`` is not news) and whose severity is at least ``--alert-min-severity``::

    {"run": ..., "run_id": ..., "rank": 0, "code": "vanishing", "severity": "warning",
     "state": "raised", "subject": "lstm", "message": ..., "fix": ..., "step": 120,
     "url": "http://127.0.0.1:8765/#/run/<run_id>/0"}

A Slack incoming webhook (``hooks.slack.com``) gets ``{"text": ...}`` and a Discord
one (``discord.com/api/webhooks``) ``{"content": ...}`` instead. Ingest only puts the
message on a bounded queue (:data:`QUEUE_SIZE`; beyond it new ones are dropped and
counted); one thread per webhook sends them, retrying with backoff, so a dead webhook
delays neither ingest nor the other webhooks. A webhook that keeps failing is logged
once, and once more when it answers again.

Example:
    >>> body("https://hooks.slack.com/services/T/B/x", {"run": "lstm", "rank": 0,
    ...      "code": "vanishing", "severity": "warning", "state": "raised",
    ...      "subject": "rnn", "message": "m", "fix": "", "step": 3,
    ...      "url": "http://h/#/run/1/0"})["text"].splitlines()[0]
    '[gradwatch] warning vanishing raised in run lstm (rank 0, rnn) at step 3: m'
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit

log = logging.getLogger("gradwatch.webhooks")

QUEUE_SIZE = 1000
RETRIES = 4  # attempts per message: 1 + 3 retries
BACKOFF_S = (0.5, 2.0, 8.0)
TIMEOUT_S = 5.0
_RANK = {"info": 0, "warning": 1, "error": 2}


def flavour(url: str) -> str:
    """``slack``, ``discord`` or ``json``: the body shape a webhook URL expects."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host == "hooks.slack.com":
        return "slack"
    if host in ("discord.com", "discordapp.com") and parts.path.startswith("/api/webhooks"):
        return "discord"
    return "json"


def summary_line(event: dict[str, Any]) -> str:
    """One line a person reads in a chat channel."""
    what = f"{event['severity']} {event['code']} {event['state']}"
    where = f"in run {event['run']} (rank {event['rank']}"
    where += f", {event['subject']})" if event.get("subject") else ")"
    step = f" at step {event['step']}" if event.get("step") is not None else ""
    text = f"[gradwatch] {what} {where}{step}: {event.get('message') or ''}".rstrip(": ")
    if event.get("fix") and event["state"] == "raised":
        text += f"\nFix: {event['fix']}"
    return text + f"\n{event['url']}"


def body(url: str, event: dict[str, Any]) -> dict[str, Any]:
    """What is POSTed to ``url`` for ``event``."""
    kind = flavour(url)
    if kind == "slack":
        return {"text": summary_line(event)}
    if kind == "discord":
        return {"content": summary_line(event)[:2000]}
    return event


class Webhooks:
    """The senders: per webhook a bounded queue and a daemon thread; :meth:`notify`
    never blocks."""

    def __init__(self, urls: tuple[str, ...], min_severity: str = "warning",
                 base_url: str = "http://127.0.0.1:8765") -> None:
        self.urls = urls
        self.min_rank = _RANK[min_severity]
        self.base_url = base_url.rstrip("/")
        self.queues: dict[str, queue.Queue[dict[str, Any]]] = {}
        self.dropped = 0
        self.sent = 0
        self.failed = 0
        self._dead: set[str] = set()
        for url in dict.fromkeys(urls):
            self.queues[url] = queue.Queue(QUEUE_SIZE)
            threading.Thread(
                target=self._run, args=(url,), name="gradwatch-webhook", daemon=True
            ).start()

    @classmethod
    def from_settings(cls, settings: Any) -> Webhooks | None:
        """None when no webhook is configured (nothing is started)."""
        if not settings.alert_webhooks:
            return None
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        if host in ("0.0.0.0", "[::]"):  # noqa: S104 - a bind address, not a link
            host = "127.0.0.1"
        base = settings.public_url or f"http://{host}:{settings.port}"
        return cls(tuple(settings.alert_webhooks), settings.alert_min_severity, base)

    def notify(self, hello: Any, batch: Any) -> None:
        """Queue one POST per webhook for each raised or cleared alert of the batch."""
        for record in batch.records:
            if record.kind != "alert" or record.state == "updated":
                continue
            if _RANK.get(record.severity, 1) < self.min_rank:
                continue
            event = {
                "run": hello.run,
                "run_id": batch.run_id,
                "rank": batch.rank,
                "code": record.code,
                "severity": record.severity,
                "state": record.state,
                "subject": record.subject,
                "message": record.message,
                "fix": record.hint,
                "step": record.step,
                "url": f"{self.base_url}/#/run/{quote(batch.run_id, safe='')}/{batch.rank}",
            }
            for box in self.queues.values():
                try:
                    box.put_nowait(event)
                except queue.Full:
                    if self.dropped == 0:
                        log.warning("gradwatch: the alert webhook queue is full (%d); "
                                    "dropping alerts until it drains", QUEUE_SIZE)
                    self.dropped += 1

    def _run(self, url: str) -> None:
        box = self.queues[url]
        while True:
            self._deliver(url, box.get())

    def _deliver(self, url: str, event: dict[str, Any]) -> None:
        data = json.dumps(body(url, event)).encode()
        error = ""
        for attempt in range(RETRIES):
            if attempt:
                time.sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])  # retry backoff
            request = urllib.request.Request(  # noqa: S310 - validated http(s) URLs only
                url, data=data, method="POST",
                headers={"Content-Type": "application/json", "User-Agent": "gradwatch"},
            )
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:  # noqa: S310
                    answer.read()
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code}"
                if 400 <= e.code < 500 and e.code != 429:
                    break  # the webhook refuses this body: resending will not help
            except (OSError, urllib.error.URLError) as e:
                error = str(getattr(e, "reason", e))
            else:
                self.sent += 1
                if url in self._dead:
                    self._dead.discard(url)
                    log.warning("gradwatch: alert webhook %s answers again", _safe(url))
                return
        self.failed += 1
        if url not in self._dead:
            self._dead.add(url)
            log.warning("gradwatch: alert webhook %s failed after %d attempts (%s); "
                        "later failures are not logged", _safe(url), RETRIES, error)


def _safe(url: str) -> str:
    """A webhook URL without its path (Slack and Discord put the secret there)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…"
