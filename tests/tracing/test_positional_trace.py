"""ROME's positional causal trace: the batched computation equals the definition run literally, on
an MDLM and on an autoregressive model; its figure, its choice, its file, and the method option."""

import functools

import pytest
import torch
from typer.testing import CliRunner

import timerome
import timerome.cli
from timerome import TimeromeError
from timerome.errors import DiffusionOnly
from timerome.backbones.tiny import make_tiny_checkpoint
from timerome.engine.hooks import Hooks, capture
from timerome.tracing.causal_trace import prepare
from timerome.tracing.positional_trace import (CATEGORIES, PositionalTrace, category_positions, is_positional,
                                               positional_trace, select_positional, window_layers)
from timerome.tracing.tie import add_noise, subject_noise

FACTS = [dict(subject="the author", prompt="where was the author born ?", object="city of books"),
         dict(subject="books", prompt="who did write books about sea ?", object="the author")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("pos")
    return {"mdlm": timerome.load_backbone(make_tiny_checkpoint("timerome", root / "m", layers=4)),
            "ar": timerome.load_backbone(make_tiny_checkpoint("llama", root / "a", layers=4))}


@torch.no_grad()
def literal(bb, item, noise, module, layer, t, window):
    """p(o_1) restored - corrupted at (module, layer, token t), one forward per noise sample, by hand."""
    P = len(item.prompt_ids)
    x = (item.prompt_ids if bb.family.causal else item.start(bb.mask_id))[None].to(bb.device)
    sites = [(l, module) for l in window_layers(layer, module, bb.n_layers, window)]

    def p_obj():
        logits = bb.next_logits(x[:, :P]) if bb.family.causal else bb.logits(x)[:, P]
        return float(logits.float().softmax(-1)[0, int(item.object_ids[0])])

    with capture(bb, sites) as clean:
        p_obj()
    out = 0.0
    for s in range(noise.shape[0]):
        corrupt = {(None, "embed"): add_noise(subject_noise(noise[s:s + 1], item.subject_pos, x.shape[1], bb))}
        with Hooks(bb, edit=corrupt):
            base = p_obj()
        restore = {site: (lambda site: lambda h, _st: _put(h, clean[site][0], t))(site) for site in sites}
        with Hooks(bb, edit={**corrupt, **restore}):
            out += (p_obj() - base) / noise.shape[0]
    return out


def _put(h, clean, t):
    h = h.clone()
    h[:, t] = clean[:, t]
    return h


@pytest.mark.parametrize("kind", ["mdlm", "ar"])
def test_batched_trace_equals_the_literal_definition(models, kind):
    bb = models[kind]
    r = positional_trace(bb, FACTS, n_samples=2, window=3, batch_size=16, progress=False)  # several chunks
    items, _, _, noises = prepare(bb, FACTS, n_samples=2, sigma=None, seed=0)
    assert r.effect.shape == (2, 3, 4, max(len(it.prompt_ids) for it in items))
    for f, (it, noise) in enumerate(zip(items, noises)):
        for mi, m in enumerate(r.modules):
            for layer in (0, 2, 3):
                for t in range(len(it.prompt_ids)):
                    want = literal(bb, it, noise, m, layer, t, 3)
                    assert abs(float(r.effect[f, mi, layer, t]) - want) < 1e-5, (f, m, layer, t)
    assert torch.isnan(r.effect[1, :, :, len(items[1].prompt_ids):]).all()  # past the shorter prompt


def test_causal_model_skips_tokens_before_the_subject_exactly(models):
    bb = models["ar"]
    r = positional_trace(bb, FACTS[:1], n_samples=2, progress=False)
    first = int(r.facts[0]["subject_positions"][0])
    assert first > 0 and r.stats["rows_skipped"] > 0
    assert (r.effect[0, :, :, :first] == 0).all()  # restoring what the noise never reached changes nothing
    mdlm = positional_trace(models["mdlm"], FACTS[:1], n_samples=2, progress=False)
    assert mdlm.stats["rows_skipped"] == 0  # bidirectional: the noise reaches every token


def test_joins_change_no_number(models, monkeypatch):
    import timerome.tracing.positional_trace as module

    bb = models["ar"]
    joined = positional_trace(bb, FACTS, n_samples=2, progress=False)
    monkeypatch.setattr(module, "rows_can_join", lambda backbone: False)
    alone = positional_trace(bb, FACTS, n_samples=2, progress=False)  # every row from the embedding
    torch.testing.assert_close(joined.effect, alone.effect, atol=1e-4, rtol=0, equal_nan=True)  # batch rounding
    assert alone.stats["rows_run"] > joined.stats["rows_run"] or joined.stats == alone.stats


def test_the_batch_size_changes_no_number(models):
    """A batch_size of at most n_samples + 1 stepped by 1 through slices of negative width: overlapping
    chunks counted effects ~3 times, or none (helper 45, stop 63). Now refused; any other size gives
    the same effects."""
    bb = models["mdlm"]
    big = positional_trace(bb, FACTS, n_samples=2, progress=False)
    for batch_size in (4, 5, 7):  # 4 = n_samples + 2: one restored row per forward
        small = positional_trace(bb, FACTS, n_samples=2, batch_size=batch_size, progress=False)
        torch.testing.assert_close(small.effect, big.effect, atol=1e-7, rtol=1e-3, equal_nan=True)
    assert float(big.effect.nan_to_num().abs().max()) > 1e-4  # not a vacuous match (the tiny model's effects are small)
    for batch_size in (2, 3):
        with pytest.raises(TimeromeError, match=f"batch_size {batch_size} leaves no room for a restored row"):
            positional_trace(bb, FACTS, n_samples=2, batch_size=batch_size, progress=False)


def test_per_fact_noise_gives_a_fact_the_same_effects_in_any_company(models):
    """noise "per_fact" (as `trace`'s): a fact's draws, so its effects, do not depend on the facts traced
    before it; "in_order" draws the second fact's noise after the first's."""
    bb = models["mdlm"]
    both = positional_trace(bb, FACTS, n_samples=2, sigma=0.5, noise="per_fact", progress=False)
    last = positional_trace(bb, FACTS[1:], n_samples=2, sigma=0.5, noise="per_fact", progress=False)
    T = last.effect.shape[-1]
    assert both.settings["noise"] == "per_fact" and torch.equal(both.corrupted_p[1], last.corrupted_p[0])
    assert torch.equal(both.effect[1, ..., :T].nan_to_num(), last.effect[0].nan_to_num())
    in_order = positional_trace(bb, FACTS, n_samples=2, sigma=0.5, progress=False)
    assert not torch.equal(in_order.corrupted_p[1], last.corrupted_p[0])


def test_categories_choice_file_and_figure(models, tmp_path):
    assert category_positions([2, 3, 4], 8) == [[2], [3], [4], [5], [6], [7]]
    assert category_positions([2], 4) == [[2], [], [2], [], [], [3]]
    assert category_positions([0, 1], 2) == [[0], [], [1], [], [], []]  # the last token is the subject's
    r = positional_trace(models["mdlm"], FACTS, n_samples=2, progress=False)
    assert r.categories().shape == (2, 3, 4, len(CATEGORIES))
    c = select_positional(r, ("mlp",))
    best = r.mean()[r.modules.index("mlp"), :, CATEGORIES.index("last subject token")]
    assert c.module == "mlp" and c.effect == pytest.approx(float(best.max()))
    from dataclasses import replace

    with pytest.raises(TimeromeError, match="found no effect"):  # a trace of no effect selects nothing
        select_positional(replace(r, effect=torch.where(r.effect.isnan(), r.effect, 0.0)), ("mlp",))
    path = r.save(tmp_path / "positional.safetensors")
    assert is_positional(path)
    back = PositionalTrace.load(path)
    assert torch.equal(back.effect.nan_to_num(), r.effect.nan_to_num()) and back.facts == r.facts
    from timerome.tracing.causal_trace import trace
    from timerome.tracing.heatmaps import plot_compare, plot_positional

    assert plot_positional(r, tmp_path / "p.png").stat().st_size > 1000
    assert plot_positional(r, tmp_path / "p1.png", fact=1).stat().st_size > 1000
    tie = trace(models["mdlm"], FACTS, steps=3, n_samples=2, progress=False)
    assert plot_compare(r, tie, tmp_path / "c.png").stat().st_size > 1000
    with pytest.raises(TimeromeError, match="not a positional trace"):
        tie.save(tmp_path / "tie.safetensors")
        PositionalTrace.load(tmp_path / "tie.safetensors")


def test_bad_arguments_are_one_line(models):
    bb = models["mdlm"]
    for kw, msg in ((dict(n_samples=0), "n_samples"), (dict(window=0), "window"), (dict(modules=("foo",)), "modules"),
                    (dict(layers=[9]), "layers"), (dict(sigma=-1.0), "sigma"), (dict(batch_size=1), "batch_size")):
        with pytest.raises(TimeromeError, match=msg):
            positional_trace(bb, FACTS, progress=False, **kw)
    with pytest.raises(TimeromeError, match="category"):
        select_positional(positional_trace(bb, FACTS[:1], n_samples=1, progress=False), category="middle")


def test_tie_refuses_an_autoregressive_model_in_one_line(models):
    from timerome.tracing.causal_trace import trace

    with pytest.raises(TimeromeError, match="MDLM protocol.*positional"):
        trace(models["ar"], FACTS, steps=2, n_samples=1, progress=False)


def test_the_timerome_method_places_its_memory_by_the_positional_trace(models):
    from timerome.data.task import ForgetTask
    from timerome.methods import install, method_config

    bb = models["ar"]
    facts = [timerome.data.facts.Fact(**f, target="sea rain") for f in FACTS]
    task = ForgetTask(forget_rows=[], facts=facts, background=["the author was born in the city of books ."] * 4)
    edit = install("timerome", bb, task, {"trace_kind": "positional", "select_modules": ["mlp"], "trace_samples": 2})
    try:
        assert edit.info["coordinate_source"] == "positional trace" and edit.info["point"] == "mlp"
    finally:
        edit.undo()
    with pytest.raises(TimeromeError, match="trace_kind"):
        method_config("timerome", {"trace_kind": "rome"})
    # the default, TIE, on an AR model: refused naming the settings that place it (stop 81: it named the CLI's
    # `timerome trace --positional`, which an install cannot take)
    with pytest.raises(DiffusionOnly, match="set trace_kind 'positional' .* or give a coordinate"):
        install("timerome", bb, task, {"trace_samples": 2})
    with pytest.raises(DiffusionOnly, match="coordinates 'per_fact' reads each fact's layer from a TIE trace"):
        install("codebook", bb, task, {"coordinates": "per_fact"})


def test_a_benchmark_row_its_trace_refused_names_the_positional_setting():
    """A benchmark experiment on an AR model reports the TIE-traced row as not measured, with the setting
    that measures it (the timerome method with ROME's positional trace): JSON its -c reads, a config the
    method accepts. No hint for another error, nor where the method refuses the positional trace."""
    import json

    from timerome.experiments.bench_measures import _positional_hint
    from timerome.experiments.runner import Cell
    from timerome.methods import method_config

    refused = DiffusionOnly("the diffusion-time trace (TIE) is an MDLM protocol")
    hint = _positional_hint(refused, Cell("rwku", "timerome", {"alpha": 2.0}))
    shown = json.loads(hint.split("-c '", 1)[1].rstrip("'"))
    # it traces only the modules its selection reads (resid): a third of the rows of all three
    assert shown == {"methods": ["no_edit", {"method": "timerome", "config": {
        "alpha": 2.0, "trace_kind": "positional", "trace_modules": ["resid"]}}]}
    assert method_config("timerome", shown["methods"][1]["config"])["trace_kind"] == "positional"
    mine = _positional_hint(refused, Cell("rwku", "timerome", {"trace_modules": ["resid", "mlp"]}))
    assert json.loads(mine.split("-c '", 1)[1].rstrip("'"))["methods"][1]["config"]["trace_modules"] == ["resid", "mlp"]
    assert _positional_hint(TimeromeError("another refusal"), Cell("rwku", "timerome")) == ""
    assert _positional_hint(refused, Cell("rwku", "codebook", {"coordinates": "per_fact"})) == ""  # refused there
    assert _positional_hint(refused, Cell("rwku", "ga")) == ""  # no trace_kind at all


def _ar_with_embedded_vocabulary(d):
    """A tiny random AR Llama that reads the embedded corpus: the embedded tokenizer without its mask token."""
    import json
    import shutil

    import transformers

    from timerome.backbones.loading import DEFAULT_MODEL_DIR
    from timerome.backbones.tiny import _drop_mask_token

    vocab = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)).save_pretrained(str(d))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEFAULT_MODEL_DIR / name, d / name)
    _drop_mask_token(d)
    return timerome.load_backbone(d)


def test_ablations_on_an_autoregressive_model_run_the_rows_without_tie(tmp_path):
    import json

    from timerome.experiments import run_experiment
    from timerome.experiments.ablations import AR_ROW

    bb = _ar_with_embedded_vocabulary(tmp_path / "ar")
    assert bb.causal
    res = run_experiment("ablations", seeds=(0,), out_dir=tmp_path / "abl", progress=False, backbone=bb,
                         overrides=dict(n_mc=2, n_retain=4, n_world=2, config=dict(trace_facts=2, trace_samples=1)))
    rows = json.loads((tmp_path / "abl" / "ablations.json").read_text())["summary"]
    assert set(rows) == {"no_edit", "random layer / module", "last layer 3 resid", AR_ROW}
    assert "ForgetTrajLP" not in rows["no_edit"]  # no denoising trajectory on an AR model
    assert (tmp_path / "abl" / "heatmap_compare.png").stat().st_size > 1000  # the positional trace alone
    assert "AR positional coordinate" in res["markdown"]


def cli(*args):
    res = CliRunner().invoke(timerome.cli.app, [str(a) for a in args])
    return res.exit_code, res.output


def test_the_ablations_trajectory_settings_on_an_autoregressive_checkpoint_are_refused_before_it_loads(tmp_path):
    """one_step / traj_steps set rows an AR model has no denoising trajectory for: refused once the model had
    loaded, and only where they differed from the defaults. A checkpoint that is surely autoregressive (a causal
    family, no mask token anywhere) is refused before it loads, a default given included; one with a mask
    token is left to the loaded model."""
    from timerome.backbones.loading import surely_causal
    from timerome.experiments import run_experiment

    d = make_tiny_checkpoint("llama", tmp_path / "ar")
    assert surely_causal(d) and not surely_causal(None) and not surely_causal(tmp_path / "nothing")
    assert not surely_causal(make_tiny_checkpoint("llada", tmp_path / "mdlm", layers=2))
    # a family forced on it (--family, family=) is what the load uses: a masked diffusion family is no AR model,
    # and the load's own refusal (no mask token) is the reason given, not "autoregressive" (as it was)
    assert surely_causal(d, "llama") and not surely_causal(d, "diffullama")
    with pytest.raises(TimeromeError) as e:
        run_experiment("ablations", model=str(d), seeds=(0,), out_dir=tmp_path / "forced", progress=False,
                       overrides=dict(one_step=0), load=functools.partial(timerome.load_backbone, family="diffullama"))
    assert "autoregressive" not in str(e.value) and "mask" in str(e.value), e.value
    code, out = cli("experiment", "ablations", "-m", d, "--family", "diffullama", "-c", '{"one_step": 0}',
                    "--seeds", "0", "-o", tmp_path / "forced-cli")
    assert code == 2 and "autoregressive" not in out and "mask" in out, out
    code, out = cli("experiment", "ablations", "-m", d, "-c", '{"one_step": 0}', "--seeds", "0", "-o",
                    tmp_path / "cli")  # detected: refused before the load, as before
    assert code == 2 and "which an autoregressive model" in out, out

    def never(path):
        raise AssertionError("the model loaded before the refusal")

    for over, says in ((dict(one_step=0), "one_step sets the one-step row"),
                       (dict(traj_steps=8, one_step=1), "traj_steps sets the trajectory columns' denoising steps")):
        with pytest.raises(TimeromeError, match=f"ablations: .*{says}.*which an autoregressive model .* has none of"):
            run_experiment("ablations", model=str(d), seeds=(0,), out_dir=tmp_path / "abl", progress=False,
                           overrides=over, load=never)
    with pytest.raises(TimeromeError, match="ablations: one_step sets the one-step row"):  # and in experiment all
        run_experiment("all", model=str(d), seeds=(0,), out_dir=tmp_path / "all", progress=False,
                       overrides=dict(one_step=0), load=never)
    # a model the checkpoint alone cannot tell (a Hub id, a load= alias): the loaded model decides, in the same
    # words, a default given included (it was compared with the defaults there, so one_step 0 ran)
    for model in ("org/some-hub-model", None):
        with pytest.raises(TimeromeError, match="ablations: one_step sets the one-step row, .* which an autoregressive"):
            run_experiment("ablations", model=model, seeds=(0,), out_dir=tmp_path / "abl2", progress=False,
                           overrides=dict(one_step=0), load=lambda path: timerome.load_backbone(d))


def test_the_rewrite_memory_refuses_an_autoregressive_model_before_any_work(models, monkeypatch):
    """It writes masked answer positions, which an AR model never has: built, it changed nothing
    (every answer and likelihood the same on SmolLM2), so the build and a saved one's load are refused."""
    from timerome.data.task import forget_task
    from timerome.memory.rewrite_memory import RewriteMemory
    from timerome.methods import install

    bb = models["ar"]
    task = forget_task("embedded", "forget01")

    def no_trace(*a, **k):
        raise AssertionError("the trace ran before the refusal")

    monkeypatch.setattr("timerome.methods.rewrite.gate_coordinate", no_trace)
    with pytest.raises(TimeromeError, match="autoregressive model .* never has masked positions"):
        install("rewrite", bb, task, {}, 0)
    with pytest.raises(TimeromeError, match="never has masked positions"):
        RewriteMemory(bb, (1, "resid"))
    assert not models["mdlm"].causal  # the MDLM builds (the rewrite tests): only the causal model is refused


def test_the_bar_weighs_each_fact_by_its_work(models, monkeypatch):
    """A fact's trace costs about its prompt's length squared: the bar advances by that share, so a run
    whose first facts are short does not promise an early end (review 67), and it ends full."""
    import contextlib

    import timerome.tracing.positional_trace as pt

    steps = []

    class Bar:
        def advance(self, n=1, description=None):
            steps.append(n)

    @contextlib.contextmanager
    def bar(description, total, enabled=True, completed=0):
        steps.append(("total", total))
        yield Bar()

    monkeypatch.setattr(pt, "progress_bar", bar)
    positional_trace(models["ar"], FACTS, n_samples=1, seed=0, modules=("mlp",), progress=True)
    (_, total), *shares = steps
    P = [len(models["ar"].encode_prompt(f["prompt"])) for f in FACTS]
    assert total == 2 and sum(shares) == 2 and P[0] != P[1]
    assert shares[0] / shares[1] == pytest.approx(P[0] ** 2 / P[1] ** 2)
