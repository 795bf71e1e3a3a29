"""methods/registry.py: a method's options, each word with one meaning (old names point to the new)."""

import pytest

from timerome import TimeromeError
from timerome.methods import method_config
from timerome.methods.registry import RENAMED


@pytest.mark.parametrize("method, old, new", [("ga", "steps", "grad_steps"), ("rome", "steps", "grad_steps"),
                                              ("rmu", "alpha", "retain_act_w"), ("memit", "lam", "mom2_weight")])
def test_an_old_option_name_says_its_new_one(method, old, new):
    with pytest.raises(TimeromeError, match=f"option '{old}' is called '{new}' now"):
        method_config(method, {old: 1})
    assert method_config(method, {new: 2})[new] == 2
    assert RENAMED[old][0] == new


def test_the_words_keep_their_meaning_where_they_are_options():
    # alpha stays the edit strength of the inference-time memories, lam the ridge memory's lambda
    assert "alpha" in method_config("timerome") and "lam" in method_config("timerome")
    assert "alpha" in method_config("codebook") and "steps" not in method_config("ga")
    with pytest.raises(TimeromeError, match="has no option nope"):
        method_config("ga", {"nope": 1})
