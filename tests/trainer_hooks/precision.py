"""How close a captured norm must be to the plain-autograd one it is checked against.

Float64 tensors: their norms are accumulated in float64 (scaled where squares would
underflow), so 1e-12. Float32 tensors on CPU (the cells' series, the parameter norms,
the update ratios): squared and summed in float32, so float32 rounding, ~1e-7
relative (``trainer_hooks/quantities/norms.py``); ``F32_RTOL`` is ten times that and
still catches any mix-up: a wrong row, a wrong gate, a scale left in, a float32 sum
whose underflowed or overflowed squares were not recomputed (those are off by far
more, and the fallback rows are float64-exact: the tests of them use 1e-12).
"""

F32_RTOL = 1e-6
F64_RTOL = 1e-12
