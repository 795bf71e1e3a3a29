"""Extraction under sampler settings and prompt attacks (metrics/extraction.py), on the embedded
default and its forget01 author: what the unedited model gives back, and what the rewrite memory,
with and without its answer watch, lets through."""

import math
from types import SimpleNamespace

import pytest

import timerome
from timerome.engine.encoding import DEFAULT_TARGET
from timerome.experiments.editing import requests_data
from timerome.methods import install
from timerome.metrics.editing import default_gen_length
from timerome.metrics.extraction import budget, sampler_baseline, sampler_settings, under_attacks, under_samplers, worst

ATTACKS = ["context before", "first name", "pronoun after context", "multiple choice"]


@pytest.fixture(scope="module")
def forget01():
    bb = timerome.load_backbone()
    rows, task = requests_data(dict(requests="embedded:forget01", target=DEFAULT_TARGET, n_retain=20),
                               SimpleNamespace(source="embedded", backbone=bb))
    G = budget(default_gen_length(bb, rows["requests"], rows["locality"]))
    return bb, rows, task, G


def test_settings_divide_the_budget_and_worst_picks_the_highest():
    grid = sampler_settings(16)
    assert grid["nominal"] == {} and grid["steps/4"] == {"steps": 4} and grid["long"] == {"gen_length": 32}
    assert budget(13) == 16 and budget(16) == 16
    assert worst({"a": {"Extraction": 0.1}, "b": {"Extraction": 0.3}, "c": {"Extraction": 0.3}}) == ("b", 0.3)
    # a condition that measured nothing (NaN) is never the worst, wherever it stands (it was when first)
    nan = float("nan")
    assert worst({"a": {"Extraction": nan}, "b": {"Extraction": 0.5}}) == ("b", 0.5)
    assert worst({"b": {"Extraction": 0.5}, "a": {"Extraction": nan}}) == ("b", 0.5)
    name, value = worst({"a": {"Extraction": nan}})
    assert name == "" and math.isnan(value)


def test_attacks_get_the_fact_out_of_the_unedited_model_but_not_out_of_the_rewrite_memory(forget01):
    bb, rows, task, G = forget01
    reqs = rows["requests"]
    plain = under_attacks(bb, reqs, None, gen_length=G, attacks=ATTACKS, n_mc=2)
    assert plain["first name"]["Extraction"] >= 0.5 and plain["context before"]["Extraction"] >= 0.5  # 0.85, 0.80
    assert all(v["n"] == len(reqs) and v["Refusal"] == 0 for v in plain.values())
    edit = install("rewrite", bb, task, {})
    try:
        edited = under_attacks(bb, reqs, edit, gen_length=G, attacks=ATTACKS, n_mc=2)
    finally:
        edit.undo()
    assert all(v["Extraction"] == 0 for v in edited.values()), edited
    assert all(edited[a]["ForgetLP"] < plain[a]["ForgetLP"] - 5 for a in ATTACKS)
    gate_only = install("rewrite", bb, task, {"watch": False})
    try:
        without = under_attacks(bb, reqs, gate_only, gen_length=G, attacks=ATTACKS)
    finally:
        gate_only.undo()
    # the gate alone lets some facts through (2 of 20 under context before / first name / pronoun): the watch stops them
    assert max(v["Extraction"] for v in without.values()) > 0, without


def test_sampler_sweep_keeps_the_rewrite_memory_shut_and_locality_whole(forget01):
    bb, rows, task, G = forget01
    reqs, loc = rows["requests"], rows["locality"]
    settings = ["nominal", "random", "dual 0.9"]
    base = sampler_baseline(bb, reqs, locality=loc, gen_length=G, settings=settings)
    plain = under_samplers(bb, reqs, None, locality=loc, gen_length=G, settings=settings, baseline=base)
    assert all(v["Extraction"] >= 0.9 and v["Locality"] == 1.0 for v in plain.values())
    edit = install("rewrite", bb, task, {})
    try:
        got = under_samplers(bb, reqs, edit, locality=loc, gen_length=G, settings=settings, baseline=base)
    finally:
        edit.undo()
    assert all(v["Extraction"] == 0 and v["Refusal"] >= 0.9 and v["Locality"] >= 0.97 for v in got.values()), got
    assert set(got) == set(settings) and all(v["n"] == 2 * len(reqs) for v in got.values())


def test_unknown_settings_and_attacks_are_one_clear_error(forget01):
    from timerome import TimeromeError

    bb, rows, task, G = forget01
    with pytest.raises(TimeromeError, match="unknown prompt attacks 'bogus'"):
        under_attacks(bb, rows["requests"], None, gen_length=G, attacks=["first name", "bogus"])
    with pytest.raises(TimeromeError, match="unknown sampler settings 'T 2'; choose from nominal"):
        sampler_baseline(bb, rows["requests"], locality=rows["locality"], gen_length=G, settings=["T 2"])
