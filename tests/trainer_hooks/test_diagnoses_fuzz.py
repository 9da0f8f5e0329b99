"""Records with odd or hostile contents never break a detector (hypothesis)."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradwatch.trainer_hooks.diagnoses import DETECTORS, DiagnosisEngine

numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "x", ""]),
    st.none(),
    st.booleans(),
)
names = st.one_of(st.sampled_from(["", "lstm", "decoder.cell", "Seq2Seq"]), st.text(max_size=8))
series = st.lists(numbers, max_size=40)
anything: Any = st.one_of(
    numbers, names, st.lists(numbers, max_size=3), st.dictionaries(names, numbers, max_size=3)
)

records = st.fixed_dictionaries(
    {"kind": st.sampled_from(["step", "epoch", "alert", "end", "other"])},
    optional={
        "step": st.one_of(st.integers(0, 10**6), anything),
        "t": anything,
        "duration_s": numbers,
        "loss": numbers,
        "total_norm": numbers,
        "graph_nodes": st.one_of(st.integers(0, 10**6), anything),
        "graph_truncated": anything,
        "rss_bytes": st.one_of(st.integers(0, 10**10), anything),
        "timesteps": st.one_of(
            st.dictionaries(
                names,
                st.dictionaries(st.sampled_from(["input", "hidden", "cell", "layer1"]), series),
            ),
            anything,
        ),
        "nonfinite": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "parameters": st.lists(names, max_size=3),
                    "timesteps": st.dictionaries(
                        names, st.dictionaries(names, st.integers(0, 200))
                    ),
                },
            ),
            anything,
        ),
        "profile": st.one_of(
            st.dictionaries(
                names,
                st.fixed_dictionaries(
                    {}, optional={"forward_s": numbers, "backward_s": numbers, "calls": anything}
                ),
            ),
            anything,
        ),
        "code": anything,
        "subject": anything,
    },
)


# print_blob: a failure seen once on a CI box can be replayed anywhere with its blob
@settings(max_examples=100, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records, max_size=25))
def test_no_detector_fails_on_any_record_stream(stream: list[dict[str, Any]]) -> None:
    engine = DiagnosisEngine({"graph_min_points": 2, "slowdown_min_points": 2})
    with warnings.catch_warnings(record=True) as caught:
        # A detector that raises is switched off with a warning; record it here so
        # a failure names the detector and its exception, not just a missing code.
        warnings.simplefilter("always")
        for record in stream:
            for alert in engine.observe(record):
                assert alert["kind"] == "alert" and isinstance(alert["message"], str)
        engine.finish()
    assert [str(w.message) for w in caught] == []
    assert [d.code for d in engine.detectors] == [cls.code for cls in DETECTORS]



def _warm_stream() -> list[dict[str, Any]]:
    """Heavy and light records with every field a detector reads, some of it growing."""
    out: list[dict[str, Any]] = []
    for n in range(40):
        record: dict[str, Any] = {"kind": "step", "step": n, "t": float(n),
                                  "duration_s": 0.01 * (1 + n % 3), "loss": 2.0 - n / 50}
        if n % 4 == 0:
            record |= {
                "total_norm": 1.0 + n, "graph_nodes": 100 + 10 * n,
                "timesteps": {"lstm": {"input": [10.0 ** -(k + n / 10) for k in range(12)]}},
                "profile": {"lstm": {"forward_s": 0.001 * n, "backward_s": 0.002, "calls": 1}},
            }
        out.append(record)
    return out


@settings(max_examples=100, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records, max_size=25))
def test_a_detector_skipped_for_lack_of_its_fields_would_have_done_nothing(
    stream: list[dict[str, Any]],
) -> None:
    """The engine calls a detector only for records with a field it ``needs``: on any
    record without them, the detector returns nothing and its state stays as it was."""
    engine = DiagnosisEngine({"graph_min_points": 2, "slowdown_min_points": 2})
    skippable = [d for d in engine.detectors if d.needs is not None]
    assert {d.code for d in skippable} >= {"vanishing", "graph_growth", "hotspot"}
    for record in _warm_stream():
        engine.observe(record)
    for detector in skippable:
        assert detector.needs is not None
        for record in stream:
            without = {k: v for k, v in record.items() if k not in detector.needs}
            before = pickle.dumps(vars(detector))
            assert detector.observe(without) == {}, (detector.code, without)
            assert pickle.dumps(vars(detector)) == before, (detector.code, without)
