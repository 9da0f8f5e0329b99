"""A page reads its history only once the server has subscribed it to live records
(the first message of /ws/live, `subscribed`): what a trainer sends before that is in
the history, what it sends after reaches the socket. Read earlier, a record or a
status change in between reached the page neither way, and a run that had ended
stayed `live` on screen.

Each test holds the page's live socket in Playwright (`route_web_socket`, no server
behind it) while a real trainer connection writes to a real server, and only then
says `subscribed` to the page, as the server would have."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import pytest

from .conftest import alert_record, assert_clean, end_record, step_record, wait_js

pytestmark = pytest.mark.browser

LIVE = re.compile(r"/ws/live")


def stored_alerts(server: Any, run_id: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{server.http}/api/runs/{run_id}/alerts", timeout=30) as answer:  # noqa: S310
        return list(json.load(answer))


def end_one_start_another(server: Any, raw_trainer: Any, ending: Any) -> Any:
    """What a runs list must not miss: ``ending``'s run ends and a new run starts (its
    trainer is returned)."""
    ending.send([end_record(0)])
    newcomer = raw_trainer(server, "newcomer")
    newcomer.send([step_record(0)])
    return newcomer


def loss_steps(page: Any) -> list[int]:
    return list(page.evaluate(
        "() => document.getElementById('chart-loss').data.find((t) => t.name === 'loss').x"))


def test_the_run_view_reads_what_came_before_its_subscription_from_history(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    trainer = raw_trainer(server, "subscribe-first")
    trainer.send([step_record(s) for s in range(5)])
    trainer.send([alert_record(3)])
    held: list[Any] = []

    def hold(route: Any) -> None:
        # the page's socket exists, the server has not subscribed it: the run goes on
        # and ends meanwhile
        held.append(route)
        trainer.send([step_record(s) for s in (5, 6, 7)])
        trainer.send([end_record(7)])
        route.send(json.dumps({"type": "subscribed", "run_id": trainer.run_id}))
        # the first live batch repeats an alert the history has: it counts once
        (alert,) = stored_alerts(server, trainer.run_id)
        del alert["rank"]
        route.send(json.dumps({"type": "records", "run_id": trainer.run_id, "rank": 0,
                               "seq": 2, "records": [alert]}))  # fmt: skip

    w = open_page(server, f"#/run/{trainer.run_id}",
                  prepare=lambda page: page.route_web_socket(LIVE, hold))  # fmt: skip
    w.page.wait_for_selector("body[data-painted='1'][data-scalars='1']")
    assert len(held) == 1
    assert w.page.inner_text(".toolbar .badge") == "finished"
    wait_js(w.page, "() => document.querySelector('[data-stat=step]').textContent === '7'")
    w.page.locator("#chart-loss").scroll_into_view_if_needed()
    wait_js(w.page, "() => !!document.getElementById('chart-loss').data")
    assert loss_steps(w.page) == list(range(8))
    wait_js(w.page, "() => window.gradwatch.stats.records === 1")  # the repeated alert
    assert "· 1 alerts" in w.page.inner_text("#run-sub")
    assert w.page.locator("#alerts-list article.alert").count() == 1
    assert_clean(w)


def test_the_run_view_reads_history_when_the_live_socket_closes_before_subscribing(
    gradwatch_server, open_page, raw_trainer
):
    """No live socket (a proxy without websockets): the page shows the history all the
    same."""
    server = gradwatch_server()
    trainer = raw_trainer(server, "no-live")
    trainer.send([step_record(s) for s in range(5)])
    refuse = lambda page: page.route_web_socket(LIVE, lambda route: route.close())  # noqa: E731
    w = open_page(server, f"#/run/{trainer.run_id}", prepare=refuse)
    w.page.wait_for_selector("body[data-painted='1'][data-scalars='1']")
    assert w.page.inner_text(".toolbar .badge") == "live"
    w.page.locator("#chart-loss").scroll_into_view_if_needed()
    wait_js(w.page, "() => !!document.getElementById('chart-loss').data")
    assert loss_steps(w.page) == list(range(5))
    assert_clean(w)


def test_the_runs_list_reads_the_runs_after_its_subscription(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    ending = raw_trainer(server, "ending")
    ending.send([step_record(0)])
    started: list[Any] = []

    def hold(route: Any) -> None:
        started.append(end_one_start_another(server, raw_trainer, ending))
        route.send(json.dumps({"type": "subscribed", "run_id": None}))

    w = open_page(server, prepare=lambda page: page.route_web_socket(LIVE, hold))
    w.page.wait_for_selector("body[data-view='runs'][data-painted='1']")
    (newcomer,) = started
    assert w.page.locator(f"tr[data-run-id='{newcomer.run_id}'] .badge").inner_text() == "live"
    assert w.page.locator(f"tr[data-run-id='{ending.run_id}'] .badge").inner_text() == "finished"
    assert_clean(w)


def test_the_compare_view_reads_history_after_both_subscriptions(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    runs = {name: raw_trainer(server, name) for name in ("run-a", "run-b")}
    for trainer in runs.values():
        trainer.send([step_record(s) for s in range(5)])
    by_id = {trainer.run_id: trainer for trainer in runs.values()}

    def hold(route: Any) -> None:
        (run_id,) = re.findall(r"run=([0-9a-f-]+)", route.url)
        by_id[run_id].send([step_record(s) for s in (5, 6, 7)])
        route.send(json.dumps({"type": "subscribed", "run_id": run_id}))

    a, b = runs.values()
    w = open_page(server, f"#/compare/{a.run_id}/{b.run_id}",
                  prepare=lambda page: page.route_web_socket(LIVE, hold))  # fmt: skip
    wait_js(w.page, "() => !!document.getElementById('chart-cmp-loss')?.data")
    for name in runs:
        got = w.page.evaluate("(name) => document.getElementById('chart-cmp-loss').data"
                              ".find((t) => t.name === name).x", name)  # fmt: skip
        assert list(got) == list(range(8)), name
    assert_clean(w)


def test_the_runs_list_reads_the_runs_again_once_a_reconnection_is_subscribed(
    gradwatch_server, open_page, raw_trainer
):
    """The socket drops and comes back: the list is read again once the new connection
    is subscribed, so what happened while it was down is in it."""
    server = gradwatch_server()
    ending = raw_trainer(server, "ending")
    ending.send([step_record(0)])
    sockets: list[Any] = []
    started: list[Any] = []

    def route(socket: Any) -> None:
        sockets.append(socket)
        if len(sockets) == 2:  # the reconnection
            started.append(end_one_start_another(server, raw_trainer, ending))
        socket.send(json.dumps({"type": "subscribed", "run_id": None}))

    w = open_page(server, prepare=lambda page: page.route_web_socket(LIVE, route))
    w.page.wait_for_selector("body[data-view='runs'][data-painted='1']")
    ending_badge = f"tr[data-run-id='{ending.run_id}'] .badge"
    assert w.page.locator(ending_badge).inner_text() == "live"
    sockets[0].close()  # the connection drops; the page reconnects
    w.page.wait_for_selector(f"{ending_badge}[data-status=finished]")
    (newcomer,) = started
    assert w.page.locator(f"tr[data-run-id='{newcomer.run_id}'] .badge").inner_text() == "live"
    assert len(sockets) == 2
    assert_clean(w)


def test_the_runs_list_keeps_a_live_summary_that_came_while_it_read_the_list(
    gradwatch_server, open_page, raw_trainer
):
    """A run ends while the page reads /api/runs: the `run` message says so before the
    list's answer, which was read earlier and still says `live`. The row stays
    `finished`."""
    server = gradwatch_server()
    ending = raw_trainer(server, "ending")
    ending.send([step_record(0)])
    sockets: list[Any] = []
    held: list[tuple[Any, Any]] = []

    def subscribe(socket: Any) -> None:
        sockets.append(socket)
        socket.send(json.dumps({"type": "subscribed", "run_id": None}))

    def read_then_end(route: Any) -> None:
        answer = route.fetch()  # the list as the server has it now: the run live
        (run,) = [r for r in answer.json() if r["id"] == ending.run_id]
        sockets[0].send(json.dumps({"type": "run", "run": {**run, "status": "finished"}}))
        held.append((route, answer))  # answered once the page shows the live summary

    def prepare(page: Any) -> None:
        page.route_web_socket(LIVE, subscribe)
        page.route(re.compile(r"/api/runs$"), read_then_end)

    w = open_page(server, prepare=prepare)
    badge = f"tr[data-run-id='{ending.run_id}'] .badge"
    w.page.wait_for_selector(f"{badge}[data-status=finished]")
    ((route, answer),) = held
    route.fulfill(response=answer)
    w.page.wait_for_selector("body[data-view='runs'][data-painted='1']")
    assert w.page.locator(badge).inner_text() == "finished"
    assert_clean(w)
