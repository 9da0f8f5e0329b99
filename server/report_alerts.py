"""The report's alerts panel: one card per problem, as the dashboard and the API show.

Alerts that share ``problem`` are one problem (one cause): the capture's stale-state
alerts on ``lstm1``, ``lstm2``, ``lstm3`` and the detector's own ``graph_growth`` on
``graph`` are one card listing those modules, not four. The rule is the dashboard's
(client/js/alerts.js ``problemOf``), and the count is the API's (``opens_problem``,
server/store/split.py): a record without ``problem`` (from a sender that does not
group) is its own problem, ``code:subject``, and ``graph_growth`` and
``no_gradient`` are one problem each. Within a card each member (code, subject)
shows the record that last held, so a cleared card keeps the message and the fix
that belong together. Everything from the trainer is escaped: names are text.

Example:
    >>> records = [
    ...     {"code": "graph_growth", "subject": "lstm1", "state": "raised", "step": 1,
    ...      "problem": "graph_growth", "message": "lstm1 keeps its state"},
    ...     {"code": "graph_growth", "subject": "graph", "state": "raised", "step": 5,
    ...      "problem": "graph_growth", "message": "the graph grows"},
    ...     {"code": "vanishing", "subject": "lstm", "state": "raised", "step": 2}]
    >>> [(c.problem, [m.first["subject"] for m in c.members]) for c in problem_cards(records)]
    [('graph_growth', ['lstm1', 'graph']), ('vanishing:lstm', ['lstm'])]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape as html_escape
from typing import Any

from gradwatch.protocol.names import visible


def escape(text: str) -> str:
    """HTML-escaped, with invisible controls shown as codes (names are text)."""
    return html_escape(visible(text))


_ORDER = {"error": 0, "warning": 1, "info": 2}
_PANEL = {"vanishing": "heatmap", "exploding": "heatmap", "nonfinite": "norms",
          "graph_growth": "graph", "slowdown": "time", "hotspot": "modules",
          "spike": "loss"}  # fmt: skip


def problem_of(alert: dict[str, Any]) -> str:
    """The cause an alert belongs to: alerts that share it are one problem, one card."""
    problem = alert.get("problem")
    if isinstance(problem, str) and problem:
        return problem
    code = str(alert.get("code"))
    if code in ("graph_growth", "no_gradient"):
        return code
    subject = alert.get("subject")
    return f"{code}:{'' if subject is None else subject}"


def _step(alert: dict[str, Any]) -> int:
    step = alert.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else 0


@dataclass
class Member:
    """One (code, subject) of a problem: its first record, latest, and latest that held."""

    first: dict[str, Any]
    latest: dict[str, Any]
    held: dict[str, Any] | None


@dataclass
class Card:
    """One problem: its rank, cause, and members in the order they were first raised."""

    rank: int
    problem: str
    members: list[Member] = field(default_factory=list)

    @property
    def open(self) -> list[Member]:
        return [m for m in self.members if m.latest.get("state") != "cleared"]

    @property
    def cleared(self) -> bool:
        return not self.open

    @property
    def lead(self) -> Member:
        """The member the card speaks for: the first still open, else the first."""
        return (self.open or self.members)[0]


def problem_cards(alerts: list[dict[str, Any]]) -> list[Card]:
    """Alert records grouped into problems, sorted as the dashboard sorts its cards:
    open before cleared, then by severity, then by the step of the first record."""
    by_key: dict[tuple[int, str], dict[tuple[str, str], Member]] = {}
    for alert in alerts:
        rank = alert.get("rank", 0)
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else 0
        members = by_key.setdefault((rank, problem_of(alert)), {})
        member = (str(alert.get("code")), str(alert.get("subject") or ""))
        held = None if alert.get("state") == "cleared" else alert
        known = members.get(member)
        if known is None:
            members[member] = Member(alert, alert, held)
        elif _step(alert) >= _step(known.latest):
            known.latest = alert
            if held is not None:
                known.held = held
    cards = [
        Card(rank, problem, sorted(members.values(), key=lambda m: _step(m.first)))
        for (rank, problem), members in by_key.items()
    ]
    cards.sort(
        key=lambda c: (
            c.cleared,
            _ORDER.get(str(c.lead.latest.get("severity")), 3),
            _step(c.members[0].first),
        )
    )
    return cards


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        shown = ", ".join(_fmt(v) for v in value[:8])
        return f"[{shown}, … {len(value)} values]" if len(value) > 8 else f"[{shown}]"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in list(value.items())[:8])
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _card_html(card: Card, heatmap_ids: dict[str, str]) -> str:
    lead = card.lead
    first, latest = lead.first, lead.latest
    shown = lead.held or latest  # a cleared record says only "no longer holds"
    severity = str(shown.get("severity"))
    if severity not in _ORDER:
        severity = "info"
    cleared = card.cleared
    panel = _PANEL.get(str(first.get("code")), "norms")
    target = f"panel-{panel}"
    if panel == "heatmap":
        target = heatmap_ids.get(str(first.get("subject")), "panel-profile")
    if _step(latest) != _step(first):
        step_text = f"raised at step {_step(first)}, latest at step {_step(latest)}"
    else:
        step_text = f"at step {_step(first)}"
    codes = list(dict.fromkeys(str(m.first.get("code")) for m in card.members))
    subjects = list(
        dict.fromkeys(str(m.first.get("subject")) for m in card.members if m.first.get("subject"))
    )
    raw = shown.get("evidence")
    evidence: dict[str, Any] = raw if isinstance(raw, dict) else {}
    rows = "".join(
        f"<div><dt>{escape(str(k))}</dt><dd>{escape(_fmt(v))}</dd></div>"
        for k, v in evidence.items()
    )
    others = "".join(
        f'<li><span class="mono">{escape(str(m.first.get("subject") or ""))}</span> '
        f"{escape(str((m.held or m.latest).get('message', '')))}</li>"
        for m in card.members
        if m is not lead
    )
    badge = "cleared" if cleared else severity
    return (
        f'<article class="alert {severity}{" cleared" if cleared else ""}" '
        f'data-problem="{escape(card.problem)}" data-members="{len(card.members)}">'
        f'<div class="head"><span class="badge {badge}">{badge}</span>'
        f'<span class="code">{escape(", ".join(codes))}</span>'
        + (f'<span class="mono subjects">{escape(", ".join(subjects))}</span>' if subjects else "")
        + (f'<span class="note">rank {card.rank}</span>' if card.rank else "")
        + f'<a href="#{target}">{escape(step_text)} →</a></div>'
        f'<p class="message">{escape(str(shown.get("message", "")))}</p>'
        + (
            f'<p class="note cleared-note">{escape(str(latest.get("message", "")))}</p>'
            if cleared
            else ""
        )
        + (f'<p class="fix">{escape(str(shown["hint"]))}</p>' if shown.get("hint") else "")
        + (f'<ul class="members">{others}</ul>' if others else "")
        + (f"<dl>{rows}</dl>" if rows else "")
        + "</article>"
    )


def alerts_html(alerts: list[dict[str, Any]], heatmap_ids: dict[str, str]) -> str:
    """The alerts panel's HTML: one card per problem (``heatmap_ids``: module -> panel)."""
    cards = problem_cards(alerts)
    if not cards:
        return '<p class="empty">No alerts: no diagnosis fired for this run.</p>'
    return '<div class="alerts">' + "".join(_card_html(c, heatmap_ids) for c in cards) + "</div>"
