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


# stop 67's audit (helper 51): options each method took where nothing read them, so a user's value was
# silently dropped; every one is refused before any work, and the same option where it is read is accepted
@pytest.mark.parametrize("method, unread, needle, read", [
    ("timerome", {"lam": 2.0, "lam_absolute": 1.0}, "lam is read by nothing here: lam_absolute",
     {"lam_absolute": 1.0}),
    ("random_layer", {"lam": 2.0, "lam_absolute": 1.0}, "lam is read by nothing here", {"lam": 2.0}),
    ("ga", {"lora_alpha": 16}, "lora_alpha is read by nothing here: lora_r is 0", {"lora_r": 4, "lora_alpha": 16}),
    ("npo", {"safe": False, "anchor": 2.0, "drift": 3.0}, "anchor, drift are read by nothing here: safe is false",
     {"safe": True, "anchor": 2.0, "drift": 3.0}),
    ("simnpo", {"safe": False, "check_every": 2}, "check_every is read by nothing here", {"safe": False}),
    ("alphaedit", {"null_energy": 0.9, "rel_threshold": 0.1}, "rel_threshold is read by nothing here: null_energy",
     {"rel_threshold": 0.1}),
    ("rome", {"objective": "forget", "target": "No."}, "target is read by nothing here: the objective pushes",
     {"objective": "target", "target": "No."}),
    ("memit", {"objective": "unlikelihood", "target": "No."}, "only objective 'target' writes a target",
     {"objective": "unlikelihood"}),
    ("timerome", {"coordinate": [1, "resid", 3], "step": 5}, "the coordinate's step 3 and step 5: give the "
     "denoising step once", {"coordinate": [1, "resid", 3], "step": 3}),
    ("random_layer", {"coordinate": "1:resid:3", "step": 0}, "the coordinate's step 3 and step 0",
     {"coordinate": "1:resid", "step": 0}),
    ("codebook", {"coordinate": [1, "resid", 2], "step": 1}, "give the denoising step once",
     {"coordinate": [1, "resid", 2]}),
    ("codebook", {"coordinates": "per_fact", "coordinate": [1, "resid"]}, "a given coordinate places them all",
     {"coordinates": "per_fact"}),
    ("codebook", {"coordinates": "per_fact", "trace_facts": 3}, "trace_facts is read by nothing",
     {"coordinates": "traced", "trace_facts": 3}),
    ("codebook", {"coordinates": "per_fact", "trace_kind": "positional"}, "not ROME's positional trace",
     {"coordinates": "per_fact", "trace_steps": 4}),
    ("rewrite", {"site": [3, "resid", 2]}, "its step 2 is read by nothing", {"site": [3, "resid"]}),
])
def test_an_option_nothing_would_read_is_refused(method, unread, needle, read):
    with pytest.raises(TimeromeError, match=f"method '{method}': "):
        method_config(method, unread)
    with pytest.raises(TimeromeError) as e:
        method_config(method, unread)
    assert needle in str(e.value), str(e.value)
    method_config(method, read)


def test_a_module_keeps_the_given_coordinates_step():
    """`module` replaces the point of a given coordinate; its layer and its step stay (the step was dropped,
    so a one-step edit became an every-step one)."""
    import timerome
    from timerome.methods.timerome_edit import locate

    bb = timerome.load_backbone()
    task = timerome.forget_task("embedded", "forget01")
    for config in ({"coordinate": [1, "resid", 3], "module": "mlp"}, {"coordinate": "1:attn:3", "module": "mlp"}):
        coord, _ = locate(bb, task, method_config("timerome", config))
        assert (coord.layer, coord.point, coord.step) == (1, "mlp", 3)
    edit = timerome.methods.install("random_layer", bb, task, {"coordinate": [2, "resid", 1], "module": "attn"})
    assert (edit.info["layer"], edit.info["point"], edit.info["step"]) == (2, "attn", 1)


def test_what_a_method_reads_of_a_task_depends_on_its_settings():
    """reads_retain / reads_background / draws_nothing: the training loop reads retain rows for the safe
    protocol or a retain term, never with neither; the ridge memory reads background texts only with
    whitened keys; random_layer draws nothing at a given coordinate."""
    from timerome.methods.registry import draws_nothing, reads_background, reads_retain

    cfg = method_config
    assert reads_retain("ga", cfg("ga")) and not reads_retain("ga", cfg("ga", {"safe": False}))
    assert reads_retain("npo", cfg("npo", {"safe": False})) and not reads_retain("npo", cfg("npo", {"safe": False,
                                                                                                 "retain_w": 0.0}))
    assert reads_retain("rmu", cfg("rmu", {"safe": False})) and not reads_retain("act_steer", cfg("act_steer"))
    assert reads_background("timerome", cfg("timerome")) and not reads_background("timerome", cfg(
        "timerome", {"key_metric": "paper"}))
    assert reads_background("rome", cfg("rome")) and not reads_background("rome", cfg("rome", {"stats_texts": "x"}))
    assert not reads_background("ga", cfg("ga")) and reads_background("codebook", cfg("codebook"))
    assert draws_nothing("random_layer", cfg("random_layer", {"coordinate": [1, "resid"]}))
    assert not draws_nothing("random_layer", cfg("random_layer")) and draws_nothing("timerome", cfg("timerome"))


def test_a_cached_result_of_module_with_a_stepped_coordinate_is_not_served_for_the_new_edit():
    """`module` beside a coordinate with a step kept that step only since stop 67 (every step before): the
    key of such a config is marked, so results cached for it before are recomputed; every other key is
    as it was."""
    from timerome.methods.registry import keyed

    before = method_config("timerome", {"coordinate": [1, "resid", 3], "module": "mlp"})
    assert keyed(before)["module_keeps_step"] is True
    for same in ({"coordinate": [1, "resid"], "module": "mlp"}, {"coordinate": [1, "resid", 3]}, {"module": "attn"},
                 {}):
        assert "module_keeps_step" not in keyed(method_config("timerome", same)), same
        full = method_config("timerome", same)
        assert keyed(full) == {k: v for k, v in full.items() if k != "trace_read_positions"}  # ADDED, at its default


def test_an_unsafe_training_method_that_reads_retain_rows_has_a_new_key():
    """Without the safe protocol the retain term reads every retain row since stop 68 (the early-stop check's
    rows were held out for a check that never ran): those configs' keys are marked, so their cached results
    are recomputed; GA (no retain term) and every safe config keep their keys; check_rows is refused there."""
    from timerome.methods.registry import keyed

    for name, over in (("npo", {"safe": False}), ("gd", {"safe": False}), ("simnpo", {"safe": False, "lr": 1e-3}),
                       ("rmu", {"safe": False})):
        assert keyed(method_config(name, over))["retain_reads_all_rows"] is True, name
    for name, over in (("ga", {"safe": False}), ("npo", {}), ("npo", {"safe": False, "retain_w": 0.0}), ("rmu", {})):
        assert "retain_reads_all_rows" not in keyed(method_config(name, over)), (name, over)
    with pytest.raises(TimeromeError, match="check_rows is read by nothing here: safe is false"):
        method_config("npo", {"safe": False, "check_rows": 5})


def test_a_given_coordinate_refuses_the_trace_settings_before_their_kind():
    """With a coordinate no trace runs at all: the refusal says so, whatever kind of trace was asked for."""
    with pytest.raises(TimeromeError, match="trace_steps, trace_kind choose the trace that places the memory, and "
                                            "a given coordinate skips that trace"):
        method_config("timerome", {"coordinate": [1, "resid"], "trace_kind": "positional", "trace_steps": 4})


def test_the_ablations_refuse_a_base_coordinate_with_a_step():
    from timerome.experiments.ablations import plan

    with pytest.raises(TimeromeError, match=r"ablations: the config's coordinate \[1, 'resid', 2\] has a step, and "
                                            r"the ablations compare the steps themselves \(every step against step 0"):
        plan(dict(one_step=0, config={"coordinate": [1, "resid", 2]}), 4)
    assert plan(dict(one_step=0, config={"coordinate": [1, "resid"]}), 4)  # [layer, point]: every row plans


@pytest.mark.parametrize("method, config", [("timerome", {}), ("codebook", {}), ("rewrite", {"coordinate": "traced"})])
def test_a_methods_preparation_shows_its_trace_only_where_the_caller_shows_progress(method, config, monkeypatch):
    """The trace a method's `prepare` computes is the longest part of an install on a real model: its bar
    shows where the caller asked for progress (`timerome edit`, an experiment's cells: `ctx.progress`),
    and not for `install(...)`'s default (a script, a quiet experiment)."""
    import timerome
    import timerome.methods.timerome_edit as te
    from timerome.data.task import forget_task
    from timerome.methods import install

    asked = []

    class Stop(Exception):
        pass

    def locate(backbone, task, config, progress=False):
        asked.append(progress)
        raise Stop

    monkeypatch.setattr(te, "locate", locate)
    for module in ("codebook", "rewrite"):
        monkeypatch.setattr(f"timerome.methods.{module}.locate", locate)
    bb, task = timerome.load_backbone(), forget_task("embedded", "forget01")
    for progress in (False, True):
        with pytest.raises(Stop):
            install(method, bb, task, config, progress=progress)
    assert asked == [False, True]


def test_an_edit_of_facts_with_their_own_targets_records_no_default_target():
    """Each counterfactual request says its own new object: install(...)'s edit records target none, as `timerome
    edit` records it (review 91: the API recorded "I don't know.", which no fact was given); a task whose facts
    have no target of their own records the default they were edited to."""
    import timerome
    from timerome.data.requests import load_requests
    from timerome.data.task import requests_task
    from timerome.engine.encoding import DEFAULT_TARGET

    bb = timerome.load_backbone()
    reqs, _ = load_requests("counterfactual:forget10", limit=2)
    edit = timerome.methods.install("act_steer", bb, requests_task(reqs))
    assert "target" in edit.config and edit.config["target"] is None, edit.config
    plain = timerome.methods.install("act_steer", bb, timerome.forget_task("embedded", "forget01"))
    assert plain.config["target"] == DEFAULT_TARGET, plain.config


def test_an_edit_of_facts_with_their_own_targets_is_read_and_scored_against_them():
    """act_steer steers each question toward its fact's own target (it steered every one toward "I don't
    know.", whatever the request said), and evaluate() reads a memory-less edit's forget answers against each
    fact's own target (`Edit.targets`; it read them against "I don't know.")."""
    import dataclasses

    import timerome
    from timerome.data.requests import load_requests
    from timerome.data.task import requests_task
    from timerome.engine.encoding import DEFAULT_TARGET
    from timerome.evaluation.evaluator import edit_targets

    bb = timerome.load_backbone()
    reqs, _ = load_requests("counterfactual:forget10", limit=2)
    task = requests_task(reqs)
    said = [r.fact.target for r in reqs]
    assert len(set(said)) == 2 and DEFAULT_TARGET not in said, said
    edit = timerome.methods.install("act_steer", bb, task)
    assert edit.targets == {r.fact.prompt: r.fact.target for r in reqs}, edit.targets
    assert edit_targets(edit, task.forget_rows) == said
    bare = requests_task([dataclasses.replace(r, fact=dataclasses.replace(r.fact, target=None)) for r in reqs])
    idk = timerome.methods.install("act_steer", bb, bare)
    assert idk.targets == {} and edit_targets(idk, bare.forget_rows) == [DEFAULT_TARGET] * 2
    # the steering vector is built from the targets read: the requests' own, not the default
    assert abs(edit.info["vector_norm"] - idk.info["vector_norm"]) > 1e-3, (edit.info, idk.info)
