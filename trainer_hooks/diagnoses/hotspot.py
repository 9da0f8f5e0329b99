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

Hierarchical: the hotspot is the module that holds the loop. A module run once per
step whose children run ``hotspot_min_calls`` times or more per call (a decoder
looping over target tokens, calling attention and a GRU cell each time) is named
itself, with its children as the parts (share of the forward pass and calls). A
module itself called in a loop that no profiled module holds (the training code or
the root model loops over it) is named as before. The outermost such module is
named, so the alert does not wander between children from step to step; once
raised it holds while the share stays above three quarters of ``hotspot_share``.

The fix names what can move out of the loop first, from a measured fact, not a
name: a module inside the hotspot that the profiler saw fed the very same tensor on
every call of the step (the step field ``same_input``, every tensor argument the
same object, unchanged) computes the same result each time, and can run once before
the loop (attention's key projection ``Ua(keys)`` in a tutorial's Bahdanau decoder).
Then it says when the loop itself can go: only when no step feeds on the previous
step's hidden state.

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
from .profiles import Row, read_profile


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


class HotspotDetector(Detector):
    code = "hotspot"
    needs = frozenset({"profile"})

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._seen: set[str] = set()
        self._holding: str | None = None

    def observe(self, record: Mapping[str, Any]) -> Verdicts:
        profile = record.get("profile")
        duration = as_float(record.get("duration_s"))
        if record.get("kind") != "step" or not isinstance(profile, Mapping) or not duration:
            return {}
        rows, root = read_profile(profile, duration)
        whole = root.forward_s if root is not None and root.forward_s > 0 else duration
        of_what = "the forward pass" if root is not None and root.forward_s > 0 else "the step"
        verdicts: Verdicts = {name: None for name in self._seen}
        found = self._hotspot(rows, whole)
        if found is None:
            self._holding = None
            return verdicts
        name, loop = found
        self._holding = name
        self._seen.add(name)
        hoist = _hoistable(name, record.get("same_input"), rows, whole)
        verdicts[name] = self._finding(name, loop, rows, whole, of_what, duration, hoist)
        return verdicts

    def _hotspot(self, rows: Mapping[str, Row], whole: float) -> tuple[str, int] | None:
        """(the module that holds the loop, calls per step of the loop), or None."""
        share_min = float(self.config["hotspot_share"])
        calls_min = int(self.config["hotspot_min_calls"])
        found: list[tuple[int, float, str, int]] = []
        for name, row in rows.items():
            share = row.forward_s / whole
            floor = share_min * 0.75 if name == self._holding else share_min
            if share < floor or row.calls < 1:
                continue
            inner = [
                r.calls
                for child, r in rows.items()
                if child.startswith(name + ".") and r.calls >= calls_min * row.calls
            ]
            if row.calls < calls_min and inner:
                found.append((name.count("."), -share, name, max(inner)))
            elif row.calls >= calls_min and not any(
                rows.get(a) is not None and rows[a].calls < calls_min for a in _ancestors(name)
            ):
                found.append((name.count("."), -share, name, row.calls))
        if not found:
            return None
        _, _, name, loop = min(found)
        return name, loop

    def _finding(
        self,
        name: str,
        loop: int,
        rows: Mapping[str, Row],
        whole: float,
        of_what: str,
        duration: float,
        hoist: dict[str, Any] | None,
    ) -> Finding:
        row = rows[name]
        share = min(1.0, row.forward_s / whole)
        direct = {c: r for c, r in rows.items() if _parent(c) == name}
        children = {
            c[len(name) + 1 :]: sig(min(1.0, r.forward_s / whole), 2) for c, r in direct.items()
        }
        child_calls = {c[len(name) + 1 :]: r.calls for c, r in direct.items()}
        evidence: dict[str, Any] = {
            "share": sig(share, 2),
            "of": of_what,
            "calls": row.calls,
            "loop_calls": loop,
            "holds_loop": row.calls < loop,
            "forward_s": sig(row.forward_s),
            "backward_s": sig(row.backward_s),
            "step_s": sig(duration),
            "forward_per_call_ms": sig(row.forward_s / max(row.calls, 1) * 1e3),
            "children": children,
            "child_calls": child_calls,
        }
        message = (
            f"{name} takes {share:.0%} of {of_what} ({fmt(row.forward_s * 1e3)} of "
            f"{fmt(whole * 1e3)} ms; step {fmt(duration * 1e3)} ms) "
            + (
                f"and loops {loop} times per step inside"
                if row.calls < loop
                else f"in {row.calls} calls per step"
            )
        )
        if children:
            top = sorted(children.items(), key=lambda kv: -kv[1])[:3]
            message += "; inside it: " + ", ".join(
                f"{c} {s:.0%} ({child_calls[c]} calls)" for c, s in top
            )
        hint = (
            f"The loop {'in' if row.calls < loop else 'around'} {name} runs {loop} times per step. "
        )
        if hoist is not None:
            evidence["hoist"] = hoist
            hint += (
                f"First move out of it what every call recomputes from the same tensor: "
                f"{hoist['module']} was given the very same {hoist['what']} on all "
                f"{hoist['calls']} of its calls per step, so it computed the same result "
                f"{hoist['calls']} times ({fmt(hoist['share'] * 100)}% of {of_what}): compute "
                f"{hoist['expression']} once before the loop and pass the result in. Then b"
            )
        else:
            hint += "B"
        hint += (
            "atch what is left: if each step feeds on the previous step's hidden state "
            "(Bahdanau attention on the previous hidden state, feeding back the "
            "prediction), the loop itself must stay; only when no step depends on the "
            "previous one (teacher forcing, Luong attention after the RNN) can the "
            "recurrent part run once over the whole target (a fused nn.GRU/nn.LSTM) with "
            "attention for all positions at once in batched matrix products (torch.bmm)"
        )
        return Finding("info", message, hint, evidence)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _hoistable(
    name: str, same_input: Any, rows: Mapping[str, Row], whole: float
) -> dict[str, Any] | None:
    """The outermost module inside ``name`` that the profiler saw fed the same tensor
    (every tensor argument) on every call of the step, called in the loop; or None.

    Example:
        >>> same = {"dec.att.Ua": {"args": ["input"], "of": 1, "calls": 10,
        ...                        "from": {"input": "dec.att:keys"}}}
        >>> rows = {"dec.att.Ua": Row(0.002, 0.0, 10)}
        >>> _hoistable("dec", same, rows, 0.01)["expression"]
        'Ua(keys)'
    """
    if not isinstance(same_input, Mapping):
        return None
    found: list[tuple[int, float, str, Mapping[str, Any]]] = []
    for module, entry in same_input.items():
        if not (isinstance(module, str) and module.startswith(name + ".")):
            continue
        if not isinstance(entry, Mapping):
            continue
        args, of, calls = entry.get("args"), entry.get("of"), entry.get("calls")
        if not (isinstance(args, list) and args and all(isinstance(a, str) for a in args)):
            continue
        if of != len(args) or not isinstance(calls, int) or calls < 2:
            continue  # some argument changes between calls: its result does too
        row = rows.get(module)
        share = row.forward_s / whole if row is not None and whole > 0 else 0.0
        found.append((module.count("."), -share, module, entry))
    if not found:
        return None
    _, share, module, entry = min(found)
    sources = entry.get("from")
    sources = sources if isinstance(sources, Mapping) else {}
    # the argument names as the caller knows them: "dec.att:keys" -> keys
    given = [str(sources.get(a, a)).rpartition(":")[2] for a in entry["args"]]
    local = module.rpartition(".")[2]
    what = ("tensor " if len(given) == 1 else "tensors ") + ", ".join(
        "{}'s `{}`".format(*str(sources[a]).split(":", 1)) if a in sources else f"`{a}`"
        for a in entry["args"]
    )
    return {
        "module": module,
        "args": list(entry["args"]),
        "from": dict(sources),
        "calls": entry["calls"],
        "share": sig(min(1.0, -share), 2),
        "expression": f"{local}({', '.join(given)})",
        "what": what,
    }
