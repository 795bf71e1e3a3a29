"""A prompt begins with the ids the tokenizer puts at a sequence start (DiffuLLaMA's `<s>`), as the
official pipelines feed them; answers and other fragments never do (Backbone.prompt_start)."""

import json
import warnings

import pytest
import torch
from conftest import FIXTURES
from safetensors import safe_open
from typer.testing import CliRunner

from timerome import load_backbone
from timerome.backbones import golden
from timerome.cli import app
from timerome.engine.encoding import answer_ids, encode_fact, encode_pairs, fit, text_ids
from timerome.engine.likelihood import log_likelihood
from timerome.engine.sampler import generate
from timerome.integrations.lm_eval_model import split_request
from timerome.metrics.membership import token_scores

_BB = {}


def fixture(case: str):
    if case not in _BB:
        _BB[case] = load_backbone(golden.paths(FIXTURES, case)[0])
    return _BB[case]


PROMPT = "Where was Harry Potter born ?"


def test_diffullama_prompts_begin_with_bos_as_its_tokenizer_and_golden_inputs_do():
    bb = fixture("diffullama")
    _, g = golden.paths(FIXTURES, "diffullama")
    with safe_open(str(g), framework="pt") as f:
        first = f.get_tensor("input_ids")[:, 0].tolist()
    assert bb.prompt_start == [bb.tokenizer.bos_token_id] == [first[0]] == [first[1]]
    assert bb.encode_prompt(PROMPT) == list(bb.tokenizer(PROMPT)["input_ids"])  # the official tokenizer(prompt)
    assert bb.encode(PROMPT) == bb.encode_prompt(PROMPT)[1:]  # a fragment has no start
    assert answer_ids(bb, "London")[0] != bb.tokenizer.bos_token_id


@pytest.mark.parametrize("case", [c for c in golden.CASES if golden.CASES[c].family != "diffullama"])
def test_other_families_add_no_start(case):
    bb = fixture(case)
    assert bb.prompt_start == [] and bb.encode_prompt(PROMPT) == bb.encode(PROMPT)


def test_embedded_model_adds_no_start(tiny_bb):
    assert tiny_bb.prompt_start == []


def test_facts_pairs_and_texts_take_the_start_and_subject_positions_follow_it():
    bb = fixture("diffullama")
    ef = encode_fact(bb, {"subject": "Harry Potter", "prompt": PROMPT, "object": "London"})
    assert ef.prompt_ids.tolist() == bb.encode_prompt(PROMPT)
    assert "Harry Potter" in bb.decode(ef.prompt_ids[ef.subject_pos]).strip()
    assert 0 not in ef.subject_pos.tolist()
    (q, a), = encode_pairs(bb, [{"question": PROMPT, "answer": "London"}])
    assert q == bb.encode_prompt(PROMPT) and a == answer_ids(bb, "London")
    assert text_ids(bb, PROMPT) == bb.encode_prompt(PROMPT)


def test_fit_keeps_the_start_when_it_cuts_the_prompt():
    prompt = [1, 10, 11, 12, 13, 14]
    assert fit(prompt, [7, 8], 6, keep=1) == ([1, 12, 13, 14], [7, 8], True)
    assert fit(prompt, [7, 8], 6) == ([11, 12, 13, 14], [7, 8], True)
    assert fit(prompt, [7, 8], 8, keep=1) == (prompt, [7, 8], False)


def test_generate_and_log_likelihood_take_text_as_the_ids_with_the_start():
    bb = fixture("diffullama")
    ids = torch.tensor([bb.encode_prompt(PROMPT)])
    by_text = generate(bb, PROMPT, steps=4, gen_length=4, block_length=4)
    by_ids = generate(bb, ids, steps=4, gen_length=4, block_length=4)
    assert torch.equal(by_text, by_ids) and by_text[0, 0].item() == 1
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    text = log_likelihood(bb, PROMPT, "London", n_mc=4, generator=g())
    assert text == log_likelihood(bb, bb.encode_prompt(PROMPT), answer_ids(bb, "London"), n_mc=4, generator=g())
    assert text != log_likelihood(bb, bb.encode(PROMPT), answer_ids(bb, "London"), n_mc=4, generator=g())


def test_membership_scores_the_text_not_its_start():
    bb = fixture("diffullama")
    (scores,), cut = token_scores(bb, [PROMPT], groups=2)
    assert len(scores) == len(bb.encode(PROMPT)) and cut == 0 and (scores < 0).all()


def test_lm_eval_requests_split_after_the_start():
    bb = fixture("diffullama")
    ctx, cont = split_request(bb, PROMPT + " ", "London")
    assert ctx == bb.encode_prompt(PROMPT) and ctx + cont == bb.encode_prompt(PROMPT + " London")
    ctx, cont = split_request(bb, "", "London")
    assert ctx == [1] and cont == bb.encode("London")


def test_a_memory_records_the_start_and_checkpoint_and_warns_when_the_start_differs(tmp_path):
    from timerome.memory.edit_memory import EditMemory
    from timerome.memory.memory_file import load_memory

    bb = fixture("diffullama")
    facts = [{"subject": "Harry Potter", "prompt": PROMPT, "object": "London"}]
    mem = EditMemory.build(bb, (1, "resid"), facts, key_metric="paper")
    path = mem.save(tmp_path / "m.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["timerome"])
    assert meta["prompt_start"] == [1]
    assert meta["checkpoint"] == str(golden.paths(FIXTURES, "diffullama")[0].resolve())
    shown = CliRunner().invoke(app, ["memory", "show", str(path), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["checkpoint"] == meta["checkpoint"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_memory(path, bb).prompt_start == [1]
    bb._prompt_start = []  # as a timerome that fed no start built it
    try:
        with pytest.warns(UserWarning, match=r"begin with \[1\], where this model's prompts now begin with none"):
            old = load_memory(path, bb)
        assert old.prompt_start == [1]
    finally:
        bb._prompt_start = None


def test_a_memory_of_facts_given_as_dicts_saves_and_loads(tmp_path):
    """Dicts are facts everywhere (encoding.fact_list); their save crashed (vars() of a dict), and a
    dict's other keys would have made a file that does not load."""
    from timerome.memory.edit_memory import EditMemory
    from timerome.memory.memory_file import load_memory

    bb = fixture("diffullama")
    facts = [{"id": "hp", "subject": "Harry Potter", "prompt": PROMPT, "object": "London", "source": "notes"}]
    path = EditMemory.build(bb, (1, "resid"), facts, key_metric="paper").save(tmp_path / "d.safetensors")
    (fact,) = load_memory(path, bb).facts
    assert (fact.fact_id, fact.subject, fact.object, fact.target) == ("hp", "Harry Potter", "London", None)


def test_caches_name_the_start_so_results_read_without_it_are_not_reused(tiny_bb):
    """Traces, states and experiment cells are cached by the model's cache_id: the weights' fingerprint,
    plus the start where prompts have one (results cached before prompts began with <s> are another
    reading); a model without a start keeps its keys."""
    from timerome.experiments.runner import Context

    bb = fixture("diffullama")
    assert bb.cache_id() == bb.fingerprint() + "+start1" and tiny_bb.cache_id() == tiny_bb.fingerprint()
    assert Context(bb).tag["model"] == bb.cache_id()
    assert text_ids(bb, "") == [] and text_ids(bb, PROMPT) == bb.encode_prompt(PROMPT)


def test_a_memory_read_with_another_start_takes_no_new_facts(tmp_path):
    from timerome import TimeromeError
    from timerome.memory.edit_memory import EditMemory
    from timerome.memory.memory_file import load_memory

    bb = fixture("diffullama")
    facts = [{"subject": "Harry Potter", "prompt": PROMPT, "object": "London"}]
    path = EditMemory.build(bb, (1, "resid"), facts, key_metric="paper").save(tmp_path / "m.safetensors")
    bb._prompt_start = []  # as a timerome that fed no start built it
    try:
        with pytest.warns(UserWarning):
            old = load_memory(path, bb)
    finally:
        bb._prompt_start = None
    more = [{"subject": "Harry", "prompt": "Who is Harry ?", "object": "London"}]
    with pytest.raises(TimeromeError, match=r"begin with \[1\], where this model's prompts now begin with none"):
        bb._prompt_start = []
        try:
            old.add(more)
        finally:
            bb._prompt_start = None
    fresh = load_memory(path, bb)
    assert len(fresh.add(more)) == 2


def test_a_trace_records_the_start_and_warns_when_read_with_another(tmp_path):
    """A trace's heatmaps and coordinate were read from its prompts: one traced without the start (a
    file from before prompts began with <s>) still gives its coordinate, with a warning."""
    from timerome import TimeromeError
    from timerome.tracing.causal_trace import trace
    from timerome.tracing.result import TraceResult

    bb = fixture("diffullama")
    facts = [{"subject": "Harry Potter", "prompt": PROMPT, "object": "London"}]
    traced = trace(bb, facts, steps=2, n_samples=1, layers=[0], modules=("resid",), progress=False)
    assert traced.settings["prompt_start"] == [1]
    path = traced.save(tmp_path / "t")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TraceResult.load(path).check_model(bb)
    meta = json.loads(path.with_suffix(".json").read_text())
    del meta["settings"]["prompt_start"]  # as a timerome that fed no start saved it
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match=r"traced from prompts that begin with no start token, where this model's "
                                         r"prompts now begin with \[1\]"):
        TraceResult.load(path).check_model(bb, "t")
    meta["settings"]["prompt_start"] = "<s>"
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(TimeromeError, match=r"t: settings.prompt_start must be a list of token ids, got '<s>'"):
        TraceResult.load(path).check_model(bb, "t")
