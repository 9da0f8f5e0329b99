"""Alert webhooks: a real server POSTs to a real HTTP receiver on loopback."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gradwatch.server.webhooks import body, flavour


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps every POST; answers `status`."""

    def __init__(self, status: int = 200) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.cond:
                    receiver.posts.append((self.path, json.loads(data)))
                    receiver.cond.notify_all()
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, n: int, timeout: float = 30.0) -> list[tuple[str, dict[str, Any]]]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.posts) >= n, timeout)
            return list(self.posts)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(status: int = 200) -> Receiver:
        made.append(Receiver(status))
        return made[-1]

    yield make
    for r in made:
        r.close()


def alert(step: int, code: str, state: str = "raised", severity: str = "warning",
          subject: str = "lstm1") -> dict[str, Any]:
    return {"kind": "alert", "step": step, "code": code, "severity": severity, "state": state,
            "subject": subject, "message": f"{code} in {subject}", "hint": "detach the state"}


def test_each_problem_is_posted_when_raised_and_when_cleared(
    gradwatch_server: Callable[..., Any], wire: Any, receiver: Callable[..., Receiver]
) -> None:
    hook = receiver()
    server = gradwatch_server(args=("--alert-webhook", hook.url + "/hook",
                                    "--public-url", "http://gw.example:9000"))
    run_id = wire.run_id()
    wire.send_run(server, run_id, [
        [wire.step(0), alert(0, "vanishing")],
        [wire.step(1), alert(1, "vanishing", state="updated")],  # not news: not sent
        [alert(2, "exploding", severity="info")],  # below the default minimum: not sent
        [alert(3, "vanishing", state="cleared")],
        [alert(4, "graph_growth", severity="error", subject="")],  # the last one sent
    ])
    posts = hook.wait_for(3)
    assert len(posts) == 3, posts
    assert {p for p, _ in posts} == {"/hook"}
    first, cleared, last = (event for _, event in posts)
    assert first == {
        "run": "test-run", "run_id": run_id, "rank": 0, "code": "vanishing",
        "severity": "warning", "state": "raised", "subject": "lstm1",
        "message": "vanishing in lstm1", "fix": "detach the state", "step": 0,
        "url": f"http://gw.example:9000/#/run/{run_id}/0",
    }
    assert (cleared["state"], cleared["step"], cleared["code"]) == ("cleared", 3, "vanishing")
    assert (last["code"], last["severity"]) == ("graph_growth", "error")


def test_a_minimum_severity_from_the_environment_and_several_webhooks(
    gradwatch_server: Callable[..., Any], wire: Any, receiver: Callable[..., Receiver]
) -> None:
    a, b = receiver(), receiver()
    server = gradwatch_server(env={"GRADWATCH_ALERT_WEBHOOK": f"{a.url}/a, {b.url}/b",
                                   "GRADWATCH_ALERT_MIN_SEVERITY": "error"})
    wire.send_run(server, wire.run_id(), [[alert(0, "vanishing"), alert(0, "nonfinite",
                                                                        severity="error")]])
    for r in (a, b):
        (posted,) = r.wait_for(1)
        assert posted[1]["code"] == "nonfinite"
        assert posted[1]["url"].startswith(f"http://127.0.0.1:{server.port}/#/run/")


@pytest.mark.slow
def test_a_dead_webhook_is_retried_logged_once_and_never_holds_up_ingest_or_others(
    gradwatch_server: Callable[..., Any], wire: Any, receiver: Callable[..., Receiver]
) -> None:
    good, dead = receiver(), receiver(status=503)
    server = gradwatch_server(args=("--alert-webhook", dead.url + "/dead",
                                    "--alert-webhook", good.url + "/good"))
    acks = wire.send_run(server, wire.run_id(), [[alert(0, "vanishing")],
                                                 [alert(1, "exploding")]])
    assert [a["seq"] for a in acks] == [0, 1]  # acknowledged while the dead one retries
    assert len(good.wait_for(2)) == 2
    # each message: one try and three retries with backoff (0.5, 2, 8 s), then the next
    assert len(dead.wait_for(8, timeout=60)) == 8
    deadline = time.monotonic() + 30
    while "failed after" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the server's log file for its line
    log = server.log()
    assert log.count("alert webhook") == 1, log
    assert "failed after 4 attempts (HTTP 503)" in log
    assert "/dead" not in log  # the path may hold the webhook's secret


@pytest.mark.parametrize(
    ("url", "kind", "key"),
    [("https://hooks.slack.com/services/T0/B0/xyz", "slack", "text"),
     ("https://discord.com/api/webhooks/1/abc", "discord", "content"),
     ("https://discordapp.com/api/webhooks/1/abc", "discord", "content"),
     ("https://alerts.example/hooks.slack.com", "json", "code")],
)
def test_slack_and_discord_get_their_own_body(url: str, kind: str, key: str) -> None:
    event = {"run": "lstm <b>", "run_id": "r1", "rank": 2, "code": "vanishing",
             "severity": "warning", "state": "raised", "subject": "rnn", "message": "gone",
             "fix": "shorter sequences", "step": 7, "url": "http://h/#/run/r1/2"}
    assert flavour(url) == kind
    sent = body(url, event)
    assert key in sent
    if kind != "json":
        text = sent[key]
        assert list(sent) == [key]
        assert "warning vanishing raised in run lstm <b> (rank 2, rnn) at step 7: gone" in text
        assert "Fix: shorter sequences" in text and text.endswith("http://h/#/run/r1/2")
