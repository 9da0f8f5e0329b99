import base64
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwatch.protocol import codec, dumps, loads, to_float
from gradwatch.protocol.codec import dumps_json, pack_timesteps, packed_series


def test_nonfinite_numbers_travel_as_strings_a_browser_can_parse() -> None:
    text = dumps({"loss": float("nan"), "norms": [1.0, float("inf"), float("-inf")]})
    assert "NaN" in text and "Infinity" in text
    decoded = loads(text)
    assert decoded["loss"] == "NaN"
    assert decoded["norms"][1:] == ["Infinity", "-Infinity"]
    assert math.isnan(to_float(decoded["loss"]))
    assert to_float(decoded["norms"][1]) == math.inf


def test_tiny_float64_norms_survive_the_round_trip() -> None:
    # early timesteps of a 121-step LSTM sit near 1e-29; they must not become 0
    assert loads(dumps({"x": [1.234e-29, 5e-300]}))["x"] == [1.234e-29, 5e-300]


def test_bare_nan_token_is_rejected_with_what_was_expected() -> None:
    with pytest.raises(ValueError, match="NaN"):
        loads('{"loss": NaN}')


def test_to_float_rejects_non_numbers_clearly() -> None:
    with pytest.raises(ValueError, match="expected a number"):
        to_float(True)
    with pytest.raises(ValueError, match="got 'nope'"):
        to_float("nope")


def test_packed_series_keep_every_float64_bit() -> None:
    values = [1.234e-29, 5e-324, -0.0, 1.7976931348623157e308, math.nan, math.inf, -math.inf]
    packed = loads(dumps(packed_series(values)))
    raw = base64.b64decode(packed["f64"], validate=True)
    assert raw == struct.pack(f"<{len(values)}d", *values)  # little-endian, bit for bit


def test_series_that_are_not_all_numbers_stay_lists() -> None:
    assert packed_series([1.0, "NaN"]) == [1.0, "NaN"]
    assert packed_series([]) == {"f64": ""}


def test_pack_timesteps_packs_step_series_and_leaves_the_records_given_alone() -> None:
    step = {"kind": "step", "step": 3, "loss": 0.5, "timesteps": {"lstm": {"input": [1.0, 2.0]}}}
    alert = {"kind": "alert", "code": "vanishing", "evidence": {"timesteps": {"x": [1.0]}}}
    out = pack_timesteps([step, alert])
    assert out[0]["timesteps"] == {"lstm": {"input": packed_series([1.0, 2.0])}}
    assert out[0]["loss"] == 0.5 and out[1] is alert
    assert step["timesteps"] == {"lstm": {"input": [1.0, 2.0]}}  # not changed in place


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()  # NaN and infinities included
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(message=json_like)
def test_the_fast_encoder_says_what_the_standard_library_says(message: object) -> None:
    # dumps takes pydantic-core's encoder where installed; dumps_json is the reference.
    assert loads(dumps(message)) == loads(dumps_json(message))


def test_the_fast_encoder_is_in_use_here_and_unknown_types_still_fail_clearly() -> None:
    assert codec._FAST is not None  # the [dev] install has pydantic-core: the path is tested
    assert dumps({"loss": math.nan, "x": [1e-300, -math.inf]}) == (
        '{"loss":"NaN","x":[1e-300,"-Infinity"]}'
    )
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps({"tensor": object()})
