"""``hotspot``: with ``profile=True``, the module that dominates step time, called in a loop.

From the ``profile`` field (per module: forward and backward seconds, calls per
step), a module is a hotspot when its forward + backward time is at least
``hotspot_share`` (0.4) of the step's ``duration_s`` and it runs at least
``hotspot_min_calls`` (4) times per step. The call count is the point: a module
that does most of the work in one call is doing its job; one called once per
token in a Python loop (a decoder with attention) can be batched. Among several,
the one with the largest share is named (the outermost: the root model is
excluded), with its children's shares as evidence of where inside it the time goes.

Example:
    >>> d = HotspotDetector({"hotspot_share": 0.4, "hotspot_min_calls": 4})
    >>> prof = {"decoder": {"forward_s": 0.03, "backward_s": 0.05, "calls": 24},
    ...         "encoder": {"forward_s": 0.005, "backward_s": 0.01, "calls": 1}}
    >>> v = d.observe({"kind": "step", "step": 2, "duration_s": 0.1, "profile": prof})
    >>> v["decoder"].evidence["calls"], v["decoder"].evidence["share"]
    (24, 0.8)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Detector, Finding, Verdicts, as_float, fmt, sig


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
        rows: dict[str, tuple[float, float, int]] = {}
        for name, entry in profile.items():
            if not name or not isinstance(entry, Mapping):
                continue  # "" is the whole model: it always dominates
            f = as_float(entry.get("forward_s")) or 0.0
            b = as_float(entry.get("backward_s")) or 0.0
            calls = entry.get("calls")
            rows[str(name)] = (f, b, calls if isinstance(calls, int) else 0)
        verdicts: Verdicts = {name: None for name in self._seen}
        share_min = float(self.config["hotspot_share"])
        calls_min = int(self.config["hotspot_min_calls"])
        hot = [
            (min(1.0, (f + b) / duration), name)
            for name, (f, b, calls) in rows.items()
            if calls >= calls_min and (f + b) / duration >= share_min
        ]
        if not hot:
            return verdicts
        share, name = max(hot)
        f, b, calls = rows[name]
        children = {
            child[len(name) + 1 :]: sig(min(1.0, (cf + cb) / duration), 2)
            for child, (cf, cb, _) in rows.items()
            if child.startswith(name + ".") and "." not in child[len(name) + 1 :]
        }
        evidence: dict[str, Any] = {
            "share": sig(share, 2),
            "calls": calls,
            "forward_s": sig(f),
            "backward_s": sig(b),
            "step_s": sig(duration),
            "per_call_ms": sig((f + b) / max(calls, 1) * 1e3),
            "children": children,
        }
        message = (
            f"{name} takes {share:.0%} of step time (forward {fmt(f * 1e3)} ms, backward "
            f"{fmt(b * 1e3)} ms of {fmt(duration * 1e3)} ms) in {calls} calls per step"
        )
        if children:
            top = sorted(children.items(), key=lambda kv: -kv[1])[:3]
            message += "; inside it: " + ", ".join(f"{c} {s:.0%}" for c, s in top)
        hint = (
            f"{name} runs {calls} times per step in a Python loop: batch those calls, for "
            "example run the recurrent part once over the whole sequence (teacher forcing "
            "with a fused nn.LSTM/nn.GRU) and compute attention for all positions at once "
            "with batched matrix products (torch.bmm)"
        )
        self._seen.add(name)
        verdicts[name] = Finding("info", message, hint, evidence)
        return verdicts
