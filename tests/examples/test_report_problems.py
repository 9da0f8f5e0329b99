"""`gradwatch report` on a real stored run: one card per problem, as the API counts them.

rotation_lstm's bug streams into a real `gradwatch serve` (SQLite, and PostgreSQL
where one is configured): the capture's stale-state alerts on lstm1, lstm2, lstm3 and
the detector's graph_growth on graph (raised, then updated) are five alert records of
one cause. The report, read from the same database, shows one card listing the four
modules, and its count agrees with the runs list of the API.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - 127.0.0.1 test server
        return json.loads(answer.read())


class Cards(HTMLParser):
    """The alert cards of a report: each one's attributes and its texts by element class."""

    def __init__(self) -> None:
        super().__init__()
        self.cards: list[dict[str, Any]] = []
        self._open: list[str] = []  # classes of the elements open inside the current card

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        classes = found.get("class") or ""
        if tag == "article" and "alert" in classes.split():
            self.cards.append({**found, "texts": {}})
            self._open = [classes]
        elif self._open:
            self._open.append(classes)

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        if self._open:
            texts = self.cards[-1]["texts"]
            texts[self._open[-1]] = texts.get(self._open[-1], "") + data


def test_report_of_a_stored_run_shows_one_card_per_problem_as_the_api_counts(
    gradwatch_server: Any, gradwatch_db: str, load_example: Any, tmp_path: Path
) -> None:
    server = gradwatch_server(db=gradwatch_db, token="ingest-secret")
    load_example("rotation_lstm").main(
        ["--steps", "20", "--server", server.url, "--token", "ingest-secret", "--quiet"]
    )
    (run,) = [
        r
        for r in get(f"{server.http}/api/runs?token=ingest-secret")
        if r["name"] == "rotation_lstm"
    ]
    records = get(f"{server.http}/api/runs/{run['id']}/alerts?token=ingest-secret")
    members = {(a["code"], a["subject"]) for a in records}
    assert {("graph_growth", m) for m in ("lstm1", "lstm2", "lstm3", "graph")} <= members
    assert len(records) > len({a["problem"] for a in records})  # records are not problems

    out = tmp_path / "run.html"
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "report", run["id"], "-o", str(out),
         "--db", server.db],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    html = out.read_text(encoding="utf-8")
    parser = Cards()
    parser.feed(html[html.index('id="panel-alerts"') :])
    cards = parser.cards
    # one card per problem: the API's count, and the distinct causes of its records
    assert len(cards) == run["alerts"] == len({a["problem"] for a in records})
    assert f"{run['alerts']} alerts" in html
    (growth,) = [c for c in cards if c["data-problem"] == "graph_growth"]
    assert int(growth["data-members"]) == 4
    subjects = growth["texts"]["mono subjects"].split(", ")
    assert subjects == ["lstm1", "lstm2", "lstm3", "graph"]  # in the order first raised
    # the card speaks for the first member and lists the others with their messages
    assert "lstm1" in growth["texts"]["message"]
    assert growth["texts"]["mono"] == "lstm2lstm3graph"  # the members list, one span each
