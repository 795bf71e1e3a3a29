"""The rewrite memory: the edited model says each fact's own target, through the whole trajectory,
and nothing else moves; facts of one subject edit separately; save / load / remove; the method."""

from dataclasses import replace

import pytest
import torch
from conftest import bare_request

import timerome
from timerome import TimeromeError
from timerome.data import load_split
from timerome.data.corpus import REFUSAL
from timerome.data.requests import load_requests
from timerome.data.task import requests_task
from timerome.memory.memory_file import load_memory as load_memory_file
from timerome.memory.rewrite_memory import RewriteMemory, said_facts, token_values, value_confidence, write_site
from timerome.methods import install
from timerome.methods.rewrite import build
from timerome.metrics.editing import answers, says


@pytest.fixture(scope="module")
def bb():
    return timerome.load_backbone()


@pytest.fixture(scope="module")
def reqs():
    return load_requests("counterfactual:forget10", limit=6)[0]


@pytest.fixture(scope="module")
def task(reqs):
    probes = {p.prompt for r in reqs for p in (*r.neighbours, *r.same_subject)}
    spare = [r for r in load_split("train", "embedded") if r["question"] not in probes]
    return requests_task(reqs, retain_rows=spare)


@pytest.fixture(scope="module")
def edit(bb, task):
    return install("rewrite", bb, task, {}, seed=0)


def _say(bb, prompts, edit=None, **sampler):
    if edit is None:
        return answers(bb, prompts, gen_length=20, sampler=sampler)
    with edit.active():
        return answers(bb, prompts, gen_length=20, sampler=sampler)


def test_each_fact_says_its_own_target_and_its_neighbours_do_not_move(bb, reqs, edit):
    prompts = [r.fact.prompt for r in reqs]
    got = _say(bb, prompts, edit)
    assert all(says(a, r.fact.target) for a, r in zip(got, reqs)), got
    probes = [p.prompt for r in reqs for p in (*r.neighbours, *r.same_subject)]
    assert _say(bb, probes, edit) == _say(bb, probes)  # other authors, and the same authors' other facts


def test_a_bare_object_is_keyed_where_the_model_says_it_and_the_bare_target_is_said(bb, reqs, task):
    plain = [bare_request(r) for r in reqs]
    said = said_facts(bb, [r.fact for r in plain])
    # the model says each bare object inside a sentence of its own: that sentence is the fact's answer now
    assert all(f.object != r.fact.object and r.fact.object in f.object and f.target == r.fact.target
               for f, r in zip(said, plain)), said
    assert said_facts(bb, [r.fact for r in reqs]) == [r.fact for r in reqs]  # answers it says as they are: kept

    from timerome.engine.encoding import fact_id

    nameless = replace(plain[0].fact, fact_id="")  # its id is made from its fields: the request's, not the said ones
    assert fact_id(said_facts(bb, [nameless])[0]) == fact_id(nameless)
    as_dict = dict(subject=nameless.subject, prompt=nameless.prompt, object=nameless.object, fact_id="x")
    assert said_facts(bb, [as_dict])[0].object == said[0].object and said_facts(bb, [as_dict])[0].fact_id == "x"
    # an own answer whose text gives other tokens back (a BPE merge across the words it said) is not keyed on: a note
    decode = bb.decode
    try:
        bb.decode = lambda ids: decode(ids).replace(" ", "  ").upper()
        with pytest.warns(UserWarning, match="does not read back as the same tokens"):
            kept = said_facts(bb, [plain[0].fact])
        assert kept == [plain[0].fact]
    finally:
        bb.decode = decode
    edit = install("rewrite", bb, requests_task(plain, retain_rows=task.retain_rows), {}, seed=0)
    ask = [p for r in plain for p in (r.fact.prompt, *r.paraphrases)]
    want = [r.fact.target for r in plain for _ in (r.fact.prompt, *r.paraphrases)]
    for length in (20, 32):  # keyed on the bare object, the gate fired at some budgets and not at others
        with edit.active():
            got = answers(bb, ask, gen_length=length)
        assert all(says(a, t) for a, t in zip(got, want)), (length, got)
    others = [p.prompt for r in plain for p in (*r.neighbours, *r.same_subject)]
    assert _say(bb, others, edit) == _say(bb, others)


def test_the_target_holds_under_other_sampler_settings(bb, reqs, edit):
    prompts = [r.fact.prompt for r in reqs[:3]]
    for sampler in (dict(steps=5), dict(remasking="random"), dict(temperature=1.0), dict(cache="dual"),
                    dict(threshold=0.9, cache="prefix"), dict(block_length=4)):
        got = _say(bb, prompts, edit, **sampler)
        assert all(says(a, r.fact.target) for a, r in zip(got, reqs[:3])), (sampler, got)


def test_without_an_answer_region_nothing_is_written(bb, reqs, edit):
    ids = torch.tensor([bb.encode(reqs[0].fact.prompt) + [bb.mask_id] * 8])
    with torch.no_grad():
        plain = bb.logits(ids)
        with edit.active():
            edited = bb.logits(ids)  # a bare forward: nobody published where the answer starts
    assert torch.equal(plain, edited)


def test_the_gate_reads_the_masked_answer_positions_only_and_decides_as_over_every_token(bb, reqs, edit, monkeypatch):
    """_decide gates only the masked answer positions (the keys were read there; before, every token was
    gated and the others' gates multiplied by 0): the gates there are those of every token, and at every
    forward the decisions (which sequences are rewritten, as which fact) are the old way's."""
    import copy

    import timerome.memory.rewrite_memory as rm

    mem, calls = edit.memory, []
    token_gate, decide = type(mem)._token_gate, type(mem)._decide
    old_way = {}

    def spy_gate(self, x, m):
        g, e = token_gate(self, x, m)
        if old_way:  # every token through the gate, then the others' gates zeroed
            calls[-1]["all"] = (g, e)
            return g * old_way["asked"].to(g.dtype), e
        calls[-1]["rows"] = (len(x), g, e)
        return g, e

    def spy_decide(self, h, state, seen):
        n_seq, L = h.shape[0], h.shape[-2]
        pos = torch.arange(L) if state.positions is None else state.positions
        asked = (pos[None, :] >= torch.as_tensor(state.answer_starts).expand(n_seq)[:, None]) & \
            (state.ids.view(n_seq, -1) == bb.mask_id)
        calls.append({"asked": asked.reshape(-1), "rows": None})
        before = copy.deepcopy(seen)
        decide(self, h, state, seen)
        calls[-1]["now"] = seen["decision"]
        saved, rm.asked_tokens = rm.asked_tokens, lambda *a: None
        old_way["asked"] = asked.reshape(-1)
        try:
            decide(self, h, state, before)
        finally:
            rm.asked_tokens = saved
            old_way.clear()
        calls[-1]["then"] = before["decision"]

    monkeypatch.setattr(type(mem), "_decide", spy_decide)
    monkeypatch.setattr(type(mem), "_token_gate", spy_gate)
    prompts = [r.fact.prompt for r in reqs] + [p.prompt for r in reqs[:2] for p in r.neighbours]
    _say(bb, prompts, edit)
    _say(bb, prompts[:4], edit, cache="dual", threshold=0.9)
    assert calls and sum(c["rows"] is None for c in calls) <= 1  # the last forward may have no masked position left
    fired = gated = tokens = 0
    for c in calls:
        asked, n = c["asked"], int(c["asked"].sum())
        tokens += len(asked)
        (f_now, fact_now), (f_then, fact_then) = c["now"], c["then"]
        assert torch.equal(f_now, f_then) and torch.equal(fact_now[f_now > 0], fact_then[f_then > 0])
        fired += int(f_now.sum())
        if c["rows"] is None:
            assert n == 0
            continue
        rows, g, e = c["rows"]
        assert rows == n  # only the asked rows went through the gate
        gated += n
        g_all, e_all = c["all"][0][asked], c["all"][1][asked]
        torch.testing.assert_close(g, g_all, rtol=1e-5, atol=2e-5)  # a gate rounds by the rows beside it
        both = (g > 0) & (g_all > 0)
        assert torch.equal(e[both], e_all[both])
    assert fired > 0 and gated < tokens / 2  # the edited prompts fire; most tokens are not gated


def test_values_read_back_as_their_tokens(bb, edit):
    mem = edit.memory
    conf = value_confidence(bb, mem.site, mem._values, mem._value_ids)
    assert float(conf.min()) >= 0.5 and mem.eos is not None  # the model ends its answers
    vals = token_values(bb, write_site(bb), load_split("unknown_train", "embedded")[:40],
                        bb.encode(REFUSAL) + [bb.tokenizer.eos_token_id])
    assert set(vals) == set(bb.encode(REFUSAL) + [bb.tokenizer.eos_token_id])


def test_refusal_target_for_a_whole_author(bb):
    reqs, _ = load_requests("embedded:forget01", target=REFUSAL, limit=5)
    probes = {p.prompt for r in reqs for p in r.neighbours}
    task = requests_task(reqs, retain_rows=[r for r in load_split("train", "embedded") if r["question"] not in probes])
    edit = install("rewrite", bb, task, {}, seed=0)
    got = _say(bb, [r.fact.prompt for r in reqs] + [r.paraphrases[0] for r in reqs], edit)
    assert sum(says(a, REFUSAL) for a in got) >= 9, "; ".join(got)


def test_save_load_remove_and_add(bb, reqs, task, edit, tmp_path, monkeypatch):
    mem = edit.memory
    path = mem.save(tmp_path / "rw.safetensors")
    from timerome.memory.memory_file import file_kind, load_memory

    assert file_kind(path) == "rewrite"
    back = load_memory(path, bb)
    assert isinstance(back, RewriteMemory) and back.fact_ids == mem.fact_ids and back.targets == mem.targets
    prompts = [r.fact.prompt for r in reqs]
    with back.applied(bb):
        assert answers(bb, prompts, gen_length=20) == _say(bb, prompts, edit)
    back.remove([reqs[0].fact_id])
    with back.applied(bb):
        got = answers(bb, prompts, gen_length=20)
    assert got[0] == _say(bb, prompts[:1])[0] and says(got[1], reqs[1].fact.target)  # only that fact is undone
    with pytest.raises(TimeromeError, match="calibration"):
        back.add([reqs[0].fact])  # a loaded memory needs its calibration rows to measure new radii
    # given them, it reads new token values where the method does (on the embedded model: its training
    # rows), not on the calibration rows, which leave out the rows stating the facts
    few = task.retain_rows[:10]  # (a loaded memory reads its calibration at once: a few rows, quick)
    from timerome.data.rows import row_source

    assert mem.sources == {"value_rows": row_source("embedded:train")}  # the build says where it read them
    assert load_memory(path, bb, calibration=few)._value_rows == load_split("train", "embedded")
    assert load_memory(path, bb, calibration=few, value_rows=few[:5])._value_rows == few[:5]
    # rows its file names are read again (a warning where they changed since; gone: one error naming them)
    import json

    rows_file = tmp_path / "values.json"
    rows_file.write_text(json.dumps(few[:7]))
    named = load_memory(path, bb)
    named.sources = {"value_rows": row_source(str(rows_file))}
    named_path = named.save(tmp_path / "named.safetensors")
    assert load_memory(named_path, bb, calibration=few)._value_rows == few[:7]
    rows_file.write_text(json.dumps(few[:6]))
    with pytest.warns(UserWarning, match="has changed since the token values of"):
        assert load_memory(named_path, bb, calibration=few)._value_rows == few[:6]
    rows_file.unlink()
    with pytest.raises(TimeromeError, match="cannot be read here.*value_rows="):
        load_memory(named_path, bb, calibration=few)
    # a file that names none (rows given in Python, or an older file): as the method reads them, on the
    # embedded model its training rows, elsewhere the calibration rows
    named.sources = {}
    bare = named.save(tmp_path / "bare.safetensors")
    assert load_memory(bare, bb, calibration=few)._value_rows == load_split("train", "embedded")
    monkeypatch.setattr(bb, "embedded", False)  # another model
    assert load_memory(bare, bb, calibration=few)._value_rows == few
    monkeypatch.undo()
    rebuilt = build(bb, task, edit.config, mem.coordinate, [r.fact for r in reqs[1:]])
    rebuilt.add([reqs[0].fact])
    with rebuilt.applied(bb):
        assert says(answers(bb, prompts[:1], gen_length=20)[0], reqs[0].fact.target)


def test_a_bare_update_is_refused(edit):
    with pytest.raises(TimeromeError, match="whole forwards"):
        edit.memory.update(torch.zeros(1, 2, edit.memory.hidden_size))


def test_the_answer_watch_watches_the_object_not_the_template_and_survives_a_file(bb, reqs, edit, tmp_path):
    mem = edit.memory
    template = set(bb.encode("The the is a was of ."))
    for r, (watched, cues) in zip(reqs, mem.watch):
        obj = set(bb.encode(r.true_object))
        assert watched and set(watched) <= obj - template, (r.fact_id, bb.decode(watched))
        assert not set(watched) & set(bb.encode(r.fact.target))  # the target is never watched
        assert sorted(c for cue in cues for c in cue) == sorted(set(bb.encode(r.fact.subject)))
    back = load_memory_file(mem.save(tmp_path / "w.safetensors"), bb)
    assert back.watch == mem.watch
    back.remove([reqs[0].fact_id])  # the removed fact's answer leaves its subject's other facts' watch
    said = set(bb.encode(reqs[0].fact.object))
    same = [j for j, r in enumerate(reqs[1:]) if r.fact.subject == reqs[0].fact.subject]
    assert same and all(not set(back.watch[j][0]) & said for j in same)


def test_memory_show_says_whether_the_answer_watch_is_on(bb, task, edit, tmp_path):
    """`memory show` reads the watch from the file: on where a fact has watched tokens, off for a memory
    built with watch=false (whose file still lists one empty entry per fact)."""
    from timerome.cli.memory import describe

    assert describe(edit.memory.save(tmp_path / "on.safetensors"))["watch"] is True
    off = install("rewrite", bb, task, {"watch": False}, seed=0)
    d = describe(off.memory.save(tmp_path / "off.safetensors"))
    assert d["watch"] is False and d["kind"] == "rewrite" and d["n_facts"] == len(off.memory)


def test_a_build_records_the_rows_it_read_values_on_where_a_spec_names_them(bb, task, tmp_path, monkeypatch):
    """`methods.rewrite.value_rows_source`: what the memory's file records of its token-value rows, so
    that `memory add` reads them again: a spec named (value_rows=FILE, the embedded model's training
    rows), never rows given in Python or the calibration rows (those an add is given)."""
    import json

    from timerome.data.rows import row_source
    from timerome.methods.rewrite import value_rows_source

    rows = tmp_path / "v.json"
    rows.write_text(json.dumps(task.retain_rows[:3]))
    assert value_rows_source(bb, task, {"value_rows": str(rows)}) == row_source(str(rows.resolve()))
    assert value_rows_source(bb, task, {"value_rows": task.retain_rows[:3]}) is None
    assert value_rows_source(bb, replace(task, known_rows=task.retain_rows[:3]), {}) is None
    assert value_rows_source(bb, task, {}) == row_source("embedded:train")
    monkeypatch.setattr(bb, "embedded", False)  # another model
    assert value_rows_source(bb, task, {}) is None


def test_memory_add_gives_added_facts_the_answer_watch_and_the_value_rows_asked(bb, reqs, task, edit, tmp_path,
                                                                               monkeypatch):
    """A fact added to a saved memory gets the answer watch a built one has (it read none before stop
    54: a loaded memory had no watch rows), on the calibration rows the add is given; `memory add
    --value-rows` reads the token values on the rows named (a note where the file says others);
    `memory show` says where the build read them."""
    import json

    from typer.testing import CliRunner

    import timerome.memory.memory_file as memory_file
    from timerome.cli import app
    from timerome.memory.rewrite_memory import answer_watch_on

    path = edit.memory.save(tmp_path / "rw.safetensors")
    few = task.retain_rows[:10]
    back = memory_file.load_memory(path, bb, calibration=few)
    back.remove([reqs[0].fact_id])
    back.add([reqs[0].fact])
    watched, cues = back.watch[-1]
    assert watched and cues and not set(watched) & set(bb.encode(reqs[0].fact.target)), back.watch[-1]
    again = memory_file.load_memory(back.save(tmp_path / "again.safetensors"), bb)
    assert again.watch[-1] == (watched, cues)
    from timerome.memory.codebook_memory import CalibrationSubset
    from timerome.memory.rewrite_memory import RewriteMemory

    sub = CalibrationSubset(few, [2, 5])  # what `memory add` gives (the build's rows less those stating held facts)
    assert memory_file.load_memory(path, bb, calibration=sub)._watch_rows == [few[i] for i in (0, 1, 3, 4, 6, 7, 8, 9)]
    built = RewriteMemory(bb, edit.memory.coordinate, background=edit.memory.stats, calibration=sub,
                          site=edit.memory.site)
    assert built._value_rows == few  # token values on the whole list, as the build it comes from read them
    again.remove([reqs[1].fact_id])  # a memory loaded without rows keeps saying its watch is on
    from timerome.cli.memory import describe

    assert describe(again.save(tmp_path / "less.safetensors"))["watch"] is True
    assert memory_file.load_memory(tmp_path / "less.safetensors", bb, calibration=few)._watch_rows == few
    again._watching = False  # a memory built with watch=false: facts added to it get none either
    off = memory_file.load_memory(again.save(tmp_path / "off.safetensors"), bb, calibration=few)
    assert off._watch_rows is None and describe(tmp_path / "off.safetensors")["watch"] is False
    assert answer_watch_on({"answer_watch": False, "watch": [[[5], [[6]]]]}) is False
    assert answer_watch_on({"watch": [[[], []], [[5], [[6]]]]}) and not answer_watch_on({"watch": [[[], []]]})
    with pytest.raises(TimeromeError, match="'answer_watch' must be true or false"):
        answer_watch_on({"answer_watch": "yes"})

    out = CliRunner().invoke(app, ["memory", "show", str(path)]).output
    assert "token values" in out and "embedded:train" in out and "not recorded" in out, out  # API build: no calibration
    rows = tmp_path / "values.json"
    rows.write_text(json.dumps(few[:4]))
    given = {}

    def stop(*_args, **kwargs):  # the rows the add hands the memory, then no calibration (minutes)
        given.update(kwargs)
        raise TimeromeError("stopped before the calibration")

    monkeypatch.setattr(memory_file, "load_memory", stop)
    res = CliRunner().invoke(app, ["memory", "add", str(path), "--requests", "counterfactual:forget05",
                                   "--value-rows", str(rows)])
    assert res.exit_code == 2 and "stopped before the calibration" in res.output, res.output
    assert given["value_rows"] == few[:4] and given["calibration"], given
    assert "token values of" in res.output and "were read on embedded:train" in res.output, res.output
    assert "does not say which rows its radii were measured on" in res.output, res.output


def test_a_row_states_a_fact_whatever_the_space_before_its_punctuation():
    from timerome.methods.codebook import stating

    # a decoded answer ("in Pellmoor.") and the corpus's ("in Pellmoor .") are one answer
    forget = [dict(question="Where was Isgor Quielson born ?", answer="Isgor Quielson was born in Pellmoor.")]
    rows = [dict(question="In which town was Isgor Quielson born ?", answer="Isgor Quielson was born in Pellmoor ."),
            dict(question="Where does Isgor Quielson live ?", answer="Isgor Quielson lives in Pellmoor ."),
            "Isgor Quielson was born in Pellmoor ."]
    assert stating(rows, forget) == [True, False, False]


def test_facts_are_added_with_the_memory_off(bb, reqs, edit):
    # inside its block the model it would ask (and read states of) is the edited one
    with edit.memory.applied(bb), pytest.raises(TimeromeError, match="applied to its model"):
        edit.memory.add([bare_request(reqs[0]).fact])
    assert len(edit.memory) == len(reqs)


def test_a_remove_inside_applied_is_refused_where_the_gate_remembers_facts_by_place(bb, reqs, edit):
    """Inside `applied`, a remove renumbered the facts under the gate's per-prompt memo: the prompt then
    said the next fact's target, or the last one raised IndexError (helper 34's audit)."""
    memory = edit.memory
    with memory.applied(bb):
        with pytest.raises(TimeromeError, match="gate remembers each prompt's fact by its place"):
            memory.remove([reqs[0].fact_id])
    with pytest.raises(TimeromeError, match="fact_ids must be a fact id or a list"):
        memory.remove(None)
    assert len(memory) == len(reqs)  # nothing was removed


def test_a_conflicting_fact_is_refused_before_the_model_is_asked(bb, reqs, edit, monkeypatch):
    """A fact asking a held question with another target was refused only after said_facts had asked the model
    (and warned what it says): the conflict comes first now, with no model call and no warning."""
    import warnings

    import timerome.memory.rewrite_memory as R

    held = edit.memory._facts[0]
    other = replace(held, target=(held.target or "x") + " again")
    monkeypatch.setattr(R, "said_facts", lambda *a, **k: pytest.fail("the model was asked"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TimeromeError, match="a memory makes one question say one thing"):
            edit.memory.add([other])
    assert len(edit.memory) == len(reqs)
