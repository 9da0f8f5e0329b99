import math

import pytest

from gradwatch.protocol import dumps, loads, to_float


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
