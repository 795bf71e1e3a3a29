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


# stop 63's audit of the methods: values each method took without a word, and what they did
@pytest.mark.parametrize("method, option, value, needle", [
    ("alphaedit", "l2", 0, "> 0"),              # the null-space solve unbounded: retain LP -103 nats
    ("memit", "mom2_weight", 0, "> 0"),         # likewise: retain LP -105 nats
    ("rome", "clamp", 0, "> 0"),                # every delta zero: ROME silently edited nothing
    ("unke", "clamp", -1, "> 0"),               # the delta's sign flipped at every step
    ("alphaedit", "null_energy", 2.0, "(0, 1) or null"),   # every direction kept: nothing preserved
    ("alphaedit", "rel_threshold", 1.0, "(0, 1)"),
    ("rmu_like", "threshold", 2.0, "[-1, 1)"),  # a gate that never fires: a silent no-edit
    ("rmu", "steer", -300, "> 0"),
    ("adaptive_rmu", "scale", -5, "> 0"),
    ("timerome", "alpha", -1, ">= 0"),
    ("codebook", "alpha", -1, ">= 0"),
    ("rmu_like", "strength", -1, ">= 0"),
    ("act_steer", "layer", "x", "integer index"),  # int('x'): a traceback
    ("rmu", "layer", 1.9, "integer index"),        # read as layer 1
    ("timerome", "step", True, "integer index"),   # read as step 1
    ("rmu", "update_layers", 2.5, "integer >= 1"),
    ("timerome", "target", "", "non-empty text"),  # replaced by the default, recorded as ''
])
def test_a_method_option_out_of_its_range_is_refused(method, option, value, needle):
    with pytest.raises(TimeromeError) as e:
        method_config(method, {option: value})
    assert f"option {option} must be" in str(e.value) and needle in str(e.value), str(e.value)


def test_the_defaults_and_the_canonical_rows_pass_the_checks():
    from timerome.methods import available, get_method

    for name in available():
        m = get_method(name)
        for row in m.canonical:
            method_config(name, dict(m.defaults, **row))  # every default and row value checked as if given
