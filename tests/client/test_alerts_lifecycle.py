"""One alert through its life in the alerts panel: raised, updated with new evidence,
cleared, both live and in a replay from history. The panel shows the latest state of
each (rank, code, subject): a cleared alert is marked cleared, keeps the message that
last held and sorts after the active ones; going back in a replay shows the state it
had then."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import alert_record, step_record, wait_js

pytestmark = pytest.mark.browser

ITEM = "#alerts-list article.alert[data-code=vanishing]"


def lifecycle(step: int, state: str, reach: int) -> dict[str, Any]:
    alert = alert_record(step)
    alert["state"] = state
    alert["message"] = f"lstm: gradient reaches back only {reach} of 121 timesteps"
    alert["evidence"] = {"horizon": 121 - reach, "reach": reach, "suggested_truncation": reach}
    return alert


RAISED, UPDATED, CLEARED = (6, "raised", 20), (10, "updated", 15), (14, "cleared", 90)


def shown(page: Any) -> dict[str, Any]:
    """What the panel shows for the vanishing alert, read from the page."""
    return page.eval_on_selector(
        ITEM,
        """e => ({cleared: e.classList.contains('cleared'),
                  badge: e.querySelector('.badge').textContent,
                  message: e.querySelector('.message').textContent,
                  goto: e.querySelector('button.goto').textContent})""",
    )


def wait_badge(page: Any, badge: str) -> None:
    wait_js(page, f"""() => {{ const b = document.querySelector('{ITEM} .badge');
        return !!b && b.textContent === '{badge}'; }}""")


def test_an_alert_goes_raised_updated_cleared_live(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, "alert-lifecycle")
    trainer.send([step_record(s, timesteps=40) for s in range(6)])
    w = open_page(server, f"#/run/{trainer.run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    # Another alert that stays active, to see the cleared one sort after it.
    trainer.send([step_record(6, timesteps=40), alert_record(6, "slowdown", "step"),
                  lifecycle(*RAISED)])  # fmt: skip
    w.page.wait_for_selector(ITEM)
    first = shown(w.page)
    assert (first["cleared"], first["badge"]) == (False, "warning")
    assert "only 20 of 121" in first["message"] and "at step 6" in first["goto"]
    trainer.send([step_record(s, timesteps=40) for s in range(7, 11)] + [lifecycle(*UPDATED)])
    wait_js(w.page, f"() => document.querySelector('{ITEM} .message').textContent"
                    ".includes('only 15 of 121')")  # fmt: skip
    updated = shown(w.page)
    assert (updated["cleared"], updated["badge"]) == (False, "warning")
    assert "raised at step 6, latest at step 10" in updated["goto"]
    trainer.send([step_record(s, timesteps=40) for s in range(11, 15)] + [lifecycle(*CLEARED)])
    wait_badge(w.page, "cleared")
    cleared = shown(w.page)
    # A cleared card keeps the message of the last record that held (the cleared record's
    # own text describes the evidence that no longer holds).
    assert cleared["cleared"] and "only 15 of 121" in cleared["message"]
    assert "raised at step 6, latest at step 14" in cleared["goto"]
    codes = w.page.eval_on_selector_all(
        "#alerts-list article.alert", "es => es.map(e => e.dataset.code)"
    )
    assert codes == ["slowdown", "vanishing"]  # the cleared one sorts last
    assert w.errors == [], w.errors


def test_a_replay_shows_the_alerts_state_at_each_position(gradwatch_server, open_page, raw_trainer):
    server = gradwatch_server()
    trainer = raw_trainer(server, "alert-replay")
    records: list[dict[str, Any]] = [step_record(s, timesteps=40) for s in range(20)]
    # In step order after the step each fired at, as the trainer sends them.
    for step, state, reach in (CLEARED, UPDATED, RAISED):
        records.insert(step + 1, lifecycle(step, state, reach))
    trainer.send(records)
    w = open_page(server, f"#/replay/{trainer.run_id}")
    w.page.wait_for_selector("#replay-position")

    def seek(position: int) -> None:
        w.page.eval_on_selector(
            "#replay-position",
            f"e => {{ e.value = '{position}'; e.dispatchEvent(new Event('change')); }}",
        )

    total = len(records)
    seek(total)
    wait_js(w.page, "() => document.getElementById('replay-label').textContent"
                    ".startsWith('replayed all')")  # fmt: skip
    wait_badge(w.page, "cleared")
    assert "only 15 of 121" in shown(w.page)["message"]
    # Back to just after the update (steps 0-10 and two alerts): updated, not cleared.
    seek(13)
    # (the cleared card already shows the update's message: wait for the state instead)
    wait_badge(w.page, "warning")
    at_update = shown(w.page)
    assert "only 15 of 121" in at_update["message"]
    assert (at_update["cleared"], at_update["badge"]) == (False, "warning")
    # Forward again past the clearing.
    seek(total)
    wait_badge(w.page, "cleared")
    assert w.errors == [], w.errors
