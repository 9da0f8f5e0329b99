"""``hotspot``: with ``profile=True``, the module that dominates the step, called in a loop.

From the ``profile`` field (per module: forward and backward seconds, calls per
step), a module is a hotspot when it takes at least ``hotspot_share`` (0.4) of the
model's forward time and runs at least ``hotspot_min_calls`` (4) times per step.

Why the forward share: forward clocks are exact (one pre- and one post-hook per
call), while the backward clocks of a module called in a loop overlap (each call's
clock stops only when the gradient of a shared input, such as the encoder outputs,
is complete; docs/CAPTURE.md), so their sum can exceed the step. The backward time
is still reported as evidence. Without the model's own entry, the share is of the
step's ``duration_s``.

Why the call count: a module that does most of the work in one call is doing its
job; one called once per token in a Python loop (a decoder with attention) can be
batched. Among several, the one with the largest share is named (the outermost; the
root model is excluded, see ``profiles.py``), with its children's shares as evidence
of where inside it the time goes.

Example:
    >>> d = HotspotDetector({"hotspot_share": 0.4, "hotspot_min_calls": 4})
    >>> prof = {"": {"forward_s": 0.04, "backward_s": 0.06, "calls": 1},
    ...         "decoder": {"forward_s": 0.03, "backward_s": 0.05, "calls": 24},
    ...         "encoder": {"forward_s": 0.005, "backward_s": 0.01, "calls": 1}}
    >>> v = d.observe({"kind": "step", "step": 2, "duration_s": 0.1, "profile": prof})
    >>> v["decoder"].evidence["calls"], v["decoder"].evidence["share"]
    (24, 0.75)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Detector, Finding, Verdicts, as_float, fmt, sig
from .profiles import read_profile


class HotspotDetector(Detector):
    code = "hotspot"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._seen: set[str] = set()

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        profile = record.get("profile")
        duration = as_float(record.get("duration_s"))
        if record.get("kind") != "step" or not isinstance(profile, Mapping) or not duration:
            return {}
        rows, root = read_profile(profile, duration)
        whole = root.forward_s if root is not None and root.forward_s > 0 else duration
        of_what = "the forward pass" if root is not None and root.forward_s > 0 else "the step"
        verdicts: Verdicts = {name: None for name in self._seen}
        share_min = float(self.config["hotspot_share"])
        calls_min = int(self.config["hotspot_min_calls"])
        hot = [
            (min(1.0, row.forward_s / whole), name)
            for name, row in rows.items()
            if row.calls >= calls_min and row.forward_s / whole >= share_min
        ]
        if not hot:
            return verdicts
        share, name = max(hot)
        row = rows[name]
        children = {
            child[len(name) + 1 :]: sig(min(1.0, r.forward_s / whole), 2)
            for child, r in rows.items()
            if child.startswith(name + ".") and "." not in child[len(name) + 1 :]
        }
        evidence: dict[str, Any] = {
            "share": sig(share, 2),
            "of": of_what,
            "calls": row.calls,
            "forward_s": sig(row.forward_s),
            "backward_s": sig(row.backward_s),
            "step_s": sig(duration),
            "forward_per_call_ms": sig(row.forward_s / max(row.calls, 1) * 1e3),
            "children": children,
        }
        message = (
            f"{name} takes {share:.0%} of {of_what} ({fmt(row.forward_s * 1e3)} of "
            f"{fmt(whole * 1e3)} ms; step {fmt(duration * 1e3)} ms) in {row.calls} calls "
            "per step"
        )
        if children:
            top = sorted(children.items(), key=lambda kv: -kv[1])[:3]
            message += "; inside it: " + ", ".join(f"{c} {s:.0%}" for c, s in top)
        hint = (
            f"{name} runs {row.calls} times per step in a Python loop: batch those calls, "
            "for example run the recurrent part once over the whole sequence (teacher "
            "forcing with a fused nn.LSTM/nn.GRU) and compute attention for all positions "
            "at once with batched matrix products (torch.bmm)"
        )
        self._seen.add(name)
        verdicts[name] = Finding("info", message, hint, evidence)
        return verdicts
