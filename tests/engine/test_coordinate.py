"""engine/coordinate.py: one Coordinate, every spelling of it, checked against a model."""

import pytest

from timerome import TimeromeError, load_backbone
from timerome.engine.coordinate import Coordinate


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


@pytest.mark.parametrize("spelling", [(1, "mlp", 3), [1, "mlp", 3], {"layer": 1, "point": "mlp", "step": 3},
                                      "1:mlp:3", Coordinate(1, "mlp", 3)])
def test_every_spelling_is_one_coordinate(spelling):
    assert Coordinate.of(spelling) == Coordinate(1, "mlp", 3)


def test_step_minus_one_is_every_step_and_step_overrides():
    assert Coordinate(2, "resid", -1).step is None
    assert Coordinate.of("2:resid", step=4) == Coordinate(2, "resid", 4)
    assert Coordinate(2, "attn", 4).every_step() == Coordinate(2, "attn")
    assert Coordinate.of(Coordinate(2, "attn", 4).as_dict()) == Coordinate(2, "attn", 4)  # a header round trip


@pytest.mark.parametrize("bad", [(1, "nowhere"), (True, "resid"), (1.5, "resid"), (1, "resid", -2), "x:resid",
                                 "1:resid:2:3", 7])
def test_bad_coordinates_are_one_clear_error(bad):
    with pytest.raises(TimeromeError):
        Coordinate.of(bad)


def test_on_a_model_negative_layers_count_from_the_top(bb):
    top = Coordinate(-1, "resid").on(bb)
    assert top.layer == bb.n_layers - 1 and top.site == (bb.n_layers - 1, "resid")
    with pytest.raises(TimeromeError, match="out of range"):
        Coordinate(bb.n_layers, "resid").on(bb)
