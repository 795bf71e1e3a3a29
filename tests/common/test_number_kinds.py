"""The two predicates every table of rules judges a number with (settings, config flags, method settings,
report cells): what they take and what they refuse, including numpy's scalars, which results hold."""

import numpy as np
import pytest

from timerome.common.checks import INT64, integer, is_int, is_real, number
from timerome.errors import TimeromeError

TAKEN_AS_INT = [0, -3, INT64 - 1, -(INT64 - 1), np.int64(5), np.int32(-2)]
REFUSED_AS_INT = [True, False, 3.0, INT64, -INT64, 2**100, None, "3", np.float64(2.0)]
TAKEN_AS_REAL = [0, 0.5, -1e300, np.float32(0.25), np.float64(2.0), np.int64(7), INT64 - 1]
REFUSED_AS_REAL = [True, None, float("nan"), float("inf"), -float("inf"), np.float64("nan"), INT64, 2**100, "1.0",
                   [1.0]]


@pytest.mark.parametrize("v", TAKEN_AS_INT)
def test_is_int_takes(v):
    assert is_int(v)
    assert integer(v, "v") == int(v)  # the predicate and the refusing check agree


@pytest.mark.parametrize("v", REFUSED_AS_INT)
def test_is_int_refuses(v):
    assert not is_int(v)
    with pytest.raises(TimeromeError):
        integer(v, "v")


@pytest.mark.parametrize("v", TAKEN_AS_REAL)
def test_is_real_takes(v):
    assert is_real(v)
    assert number(v, "v") == v


@pytest.mark.parametrize("v", REFUSED_AS_REAL)
def test_is_real_refuses(v):
    assert not is_real(v)
    with pytest.raises(TimeromeError):
        number(v, "v")
