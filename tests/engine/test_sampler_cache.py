"""The sampler's fast options (cache="prefix" | "dual", threshold, refresh_every) and edits under them.

Exactness goes through the cached code path itself: a partial forward over cached keys/values
against a full forward of the same x (every family we implement, padded too), and whole
generations with a cache refreshed at every step against the exact sampler, with and without an
installed EditMemory, the act_steer baseline, classifier-free guidance and left padding.
"""

import pytest
import torch

from timerome import TimeromeError, load_backbone
from timerome.backbones.tiny import make_tiny_checkpoint
from timerome.engine.coordinate import Coordinate
from timerome.engine.hooks import Hooks, TraceState, capture, patch
from timerome.engine.sampler import denoise_step, generate
from timerome.memory.edit_memory import EditMemory

OURS = ["timerome", "llada", "mmada", "llada-moe"]
TOL = 1e-4  # a window's matmuls may round differently from the full sequence's (not bit-equal; up to
#            2.2e-5 in logits of size ~10 on an Intel Xeon); an edit that missed the cache moves them by > 1e-2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-cache")
    return {f: load_backbone(make_tiny_checkpoint(f, root / f, layers=3))
            for f in OURS + ["dream", "diffullama"]}


@pytest.fixture(scope="module")
def bb():
    return load_backbone()  # the embedded model: generations that mean something


@pytest.fixture(scope="module")
def memory(bb):
    from timerome.tracing.causal_trace import default_facts

    return EditMemory(bb).add(default_facts(8))


def _x(bb, L=20, P=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(5, bb.vocab_size - 1, (2, L), generator=g)
    x[x == bb.mask_id] = 5
    x[:, P + 2:] = bb.mask_id  # a partly revealed answer
    return x


# ------------------------------------------------------------------------------ the model level


@pytest.mark.parametrize("fam", OURS)
@pytest.mark.parametrize("window", [(6, 20), (6, 10), (10, 14)])
def test_partial_forward_over_cached_keys_equals_full_forward(tiny, fam, window):
    bb = tiny[fam]
    x = _x(bb)
    lo, hi = window
    with torch.no_grad():
        full = bb.logits(x)
        kv = bb.kv_cache()
        bb.refresh(x, kv)
        part = bb.window_logits(x, kv, lo, hi)
    assert part.shape == (2, hi - lo, full.shape[-1])
    assert (part - full[:, lo:hi]).abs().max() < TOL


@pytest.mark.parametrize("fam", OURS)
def test_partial_forward_is_padding_aware(tiny, fam):
    bb = tiny[fam]
    x = _x(bb)
    am = torch.ones_like(x, dtype=torch.bool)
    am[1, :3] = False  # left padding
    with torch.no_grad():
        full = bb.logits(x, attention_mask=am)
        kv = bb.kv_cache()
        bb.refresh(x, kv, attention_mask=am)
        part = bb.window_logits(x, kv, 8, 14, attention_mask=am)
    assert (part - full[:, 8:14]).abs().max() < TOL


def test_partial_forward_sees_stale_keys_outside_its_window(tiny):
    """The approximation is real: a token changed outside the window after the refresh is seen
    as it was (a full forward sees the new one); inside the window it is seen as it is."""
    bb = tiny["timerome"]
    x = _x(bb)
    y = x.clone()
    y[:, 2] = 7 if int(x[0, 2]) != 7 else 8  # a prompt token changes after the refresh
    with torch.no_grad():
        kv = bb.kv_cache()
        bb.refresh(x, kv)
        stale = bb.window_logits(y, kv, 8, 14)
        assert (stale - bb.logits(x)[:, 8:14]).abs().max() < TOL
        assert (stale - bb.logits(y)[:, 8:14]).abs().max() > 1e-3


def test_no_cache_forward_unchanged_and_refresh_skips_the_head(tiny):
    bb = tiny["llada"]
    x = _x(bb)
    with torch.no_grad():
        a = bb.logits(x)
        out = bb.model(input_ids=x, kv_cache=bb.kv_cache())
        b = bb.logits(x)
    assert out.logits is None
    assert torch.equal(a, b)


@pytest.mark.parametrize("fam", ["dream", "diffullama"])
def test_cache_refused_for_transformers_families(tiny, fam):
    bb = tiny[fam]
    with pytest.raises(TimeromeError, match=f"not supported for the {fam} family"):
        generate(bb, [5, 6, 7], steps=4, gen_length=4, block_length=4, cache="dual")
    # the exact sampler and a threshold still work there
    generate(bb, [5, 6, 7], steps=4, gen_length=4, block_length=4, threshold=0.5)


@pytest.mark.parametrize("point", ["resid", "attn", "mlp"])
def test_edit_hook_sees_every_position_at_a_refresh_and_the_window_after(tiny, point):
    """The edit acts on each position when its keys/values are computed: a hook on a block or
    sub-layer output gets all L positions at a refresh, then only the window (state.positions)."""
    bb = tiny["timerome"]
    x = _x(bb)
    seen = []

    def fn(h, state):
        seen.append((h.shape[1], None if state.positions is None else state.positions.tolist()))
        return h + 0.5

    with torch.no_grad(), Hooks(bb, edit={(1, point): fn}):
        full = bb.logits(x)
        kv = bb.kv_cache()
        bb.refresh(x, kv)
        part = bb.window_logits(x, kv, 8, 12)
    assert seen == [(20, None), (20, None), (4, [8, 9, 10, 11])]
    assert (part - full[:, 8:12]).abs().max() < TOL  # the edit reached the cached keys/values too


def test_every_inference_edit_is_exact_through_a_partial_forward(bb, memory):
    """The memory, the single-fact gated edit, the steering baselines (act_steer, rmu_like) and the
    codebook memory, whose gate reads the whole sequence (the subject sits outside the window)."""
    from timerome.data.task import forget_task
    from timerome.memory.gated_edit import GatedEdit
    from timerome.methods import install

    task = forget_task("embedded", "forget01")
    steer, rmu = install("act_steer", bb, task), install("rmu_like", bb, task)
    codebook = install("codebook", bb, task, {"coordinate": [0, "resid"]})
    gated = GatedEdit.from_fact(bb, memory.facts[0], memory.coordinate, alpha=4.0)
    ids = torch.tensor([bb.encode(PROMPTS[0])])
    P = ids.shape[1]
    x = torch.cat([ids, torch.full((1, 10), bb.mask_id)], 1)
    for ctx in (memory.applied(bb), gated.applied(bb), steer.active(), rmu.active(), codebook.active()):
        with torch.no_grad(), ctx:
            full = bb.logits(x)
            kv = bb.kv_cache()
            bb.refresh(x, kv)
            part = bb.window_logits(x, kv, P, P + 4)
        with torch.no_grad():
            plain = bb.logits(x)
        assert (part - full[:, P:P + 4]).abs().max() < TOL
        assert (full - plain).abs().max() > 1e-2  # the edit did act


def test_keep_and_patch_positions_map_through_the_window(tiny):
    bb = tiny["timerome"]
    x = _x(bb)
    site = (1, "resid")
    pos = torch.tensor([9, 2, 11])  # 2 lies outside the window 8..11
    with torch.no_grad():
        with capture(bb, [site], positions=pos) as full_store:
            bb.logits(x)
        kv = bb.kv_cache()
        bb.refresh(x, kv)
        with capture(bb, [site], positions=pos) as part_store:
            bb.window_logits(x, kv, 8, 12)
        kept_full, kept_part = full_store[site][0], part_store[site][0]
        assert kept_part.shape[1] == 2  # only the held positions 9 and 11, in the asked order
        assert (kept_part - kept_full[:, [0, 2]]).abs().max() < TOL
        values = {site: torch.randn(1, 3, bb.hidden_size, generator=torch.Generator().manual_seed(0))}
        with patch(bb, values, pos):
            full = bb.logits(x)
            bb.refresh(x, kv)  # position 2 is patched when its keys/values are computed
            part = bb.window_logits(x, kv, 8, 12)
    assert (part - full[:, 8:12]).abs().max() < TOL


# ------------------------------------------------------------------------------ the sampler

PROMPTS = ["Where was Isgor Quielson born ?", "What genre does Isgor Quielson write ?"]


def _prompt(bb, text=PROMPTS[0]):
    return torch.tensor([bb.encode(text)])


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("threshold", [None, 0.6])
def test_cache_refreshed_every_step_gives_the_exact_tokens(bb, cache, threshold):
    ids = _prompt(bb)
    kw = dict(steps=24, gen_length=24, block_length=8, threshold=threshold)
    ref = generate(bb, ids, **kw)
    assert torch.equal(generate(bb, ids, cache=cache, refresh_every=1, **kw), ref)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_refreshed_every_step_is_exact_with_an_edit_installed(bb, memory, cache):
    ids = _prompt(bb)
    kw = dict(steps=16, gen_length=16, block_length=8)
    plain = generate(bb, ids, **kw)
    with memory.applied(bb) as st:
        ref = generate(bb, ids, state=st, **kw)
        fast = generate(bb, ids, state=st, cache=cache, refresh_every=1, **kw)
    assert torch.equal(fast, ref)
    assert not torch.equal(ref, plain)  # the memory changes this answer


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_refreshed_every_step_is_exact_with_a_codebook_memory(bb, cache):
    from timerome.data.task import forget_task
    from timerome.methods import install

    codebook = install("codebook", bb, forget_task("embedded", "forget01"), {"coordinate": [0, "resid"]})
    ids = _prompt(bb)
    kw = dict(steps=16, gen_length=16, block_length=8)
    plain = generate(bb, ids, **kw)
    with codebook.active() as st:
        ref = generate(bb, ids, state=st, **kw)
        fast = generate(bb, ids, state=st, cache=cache, refresh_every=1, **kw)
    assert torch.equal(fast, ref)
    assert not torch.equal(ref, plain)  # the memory changes this answer


def test_cache_refreshed_every_step_is_exact_with_steering(bb):
    from timerome.data.task import forget_task
    from timerome.methods import install

    steer = install("act_steer", bb, forget_task("embedded", "forget01"))
    ids = _prompt(bb, PROMPTS[1])
    kw = dict(steps=16, gen_length=16, block_length=8)
    with steer.active():
        ref = generate(bb, ids, **kw)
        fast = generate(bb, ids, cache="dual", refresh_every=1, **kw)
    assert torch.equal(fast, ref)
    assert not torch.equal(ref, generate(bb, ids, **kw))


def test_cache_refreshed_every_step_is_exact_with_guidance_and_padding(bb):
    rows = [bb.encode(p) for p in PROMPTS]
    P = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (P - len(r)) + r for r in rows])
    am = torch.tensor([[False] * (P - len(r)) + [True] * len(r) for r in rows])
    kw = dict(steps=16, gen_length=16, block_length=8, attention_mask=am, cfg_scale=1.0)
    assert torch.equal(generate(bb, ids, cache="prefix", refresh_every=1, **kw), generate(bb, ids, **kw))


def test_step_counter_is_the_denoising_step_under_a_cache(bb):
    """state.step is set once per denoising step: a refresh and the partial forward of the same
    step see the same k, and a step-k edit acts at both forwards of step k only."""
    ids = _prompt(bb)
    st = TraceState()
    seen, steps_done = [], []

    def fn(h, state):
        seen.append((state.step, h.shape[1]))

    with Hooks(bb, edit={(0, "resid"): fn}, state=st):
        generate(bb, ids, steps=8, gen_length=16, block_length=8, state=st, cache="dual", refresh_every=3,
                 on_step=lambda k, _x: steps_done.append(k))
    L = ids.shape[1] + 16
    assert steps_done == list(range(8))
    full = [k for k, n in seen if n == L]
    assert full == [0, 3, 4, 7]  # block starts (0, 4) and every 3 steps inside a block (3, 7)
    assert [k for k, n in seen if n == 8] == list(range(8))  # one partial forward per step

    at = []
    with Hooks(bb, edit={Coordinate(0, "resid", step=4): lambda h, s: at.append((s.step, h.shape[1]))}, state=st):
        generate(bb, ids, steps=8, gen_length=16, block_length=8, state=st, cache="dual")
    assert at == [(4, L), (4, 8)]


def test_threshold_reveals_all_confident_and_at_least_one(bb):
    """Each step reveals the most confident candidate plus every one at or above tau (Fast-dLLM's rule)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 10, generator=g) * 3
    x = torch.full((2, 6), -1)  # a sentinel no prediction equals
    masked = torch.ones(2, 6, dtype=torch.bool)
    masked[1, 4:] = False
    conf = torch.softmax(logits.double(), -1).max(-1).values
    for tau in (0.3, 0.6, 0.99):
        out = denoise_step(x, logits, masked, torch.ones(2, dtype=torch.long), threshold=tau)
        for b in range(2):
            c = conf[b].masked_fill(~masked[b], -1)
            want = (c >= tau) | (torch.arange(6) == c.argmax())
            assert torch.equal(out[b] != -1, want)
            assert torch.equal(out[b][want], logits[b].argmax(-1)[want])


@pytest.mark.parametrize("cache", [None, "dual"])
def test_threshold_takes_fewer_steps_and_fills_every_position(bb, cache):
    ids = _prompt(bb)
    steps_done = []
    out = generate(bb, ids, steps=24, gen_length=24, block_length=8, threshold=0.3, cache=cache,
                   on_step=lambda k, _x: steps_done.append(k))
    assert not (out == bb.mask_id).any()
    assert 3 <= len(steps_done) < 24  # at least one step per block, fewer than one per token
    assert steps_done == list(range(len(steps_done)))


def test_fast_samplers_stay_close_to_the_exact_one(bb):
    """Not exact (stale keys/values, parallel reveals) but close on the embedded model's answers."""
    ids = _prompt(bb)
    ref = generate(bb, ids, steps=16, gen_length=16, block_length=8)
    for kw in (dict(cache="prefix"), dict(cache="dual"), dict(cache="dual", threshold=0.9)):
        out = generate(bb, ids, steps=16, gen_length=16, block_length=8, **kw)
        agree = (out[0, ids.shape[1]:] == ref[0, ids.shape[1]:]).float().mean()
        assert agree >= 0.5, (kw, float(agree))


@pytest.mark.parametrize("kw, msg", [
    (dict(cache="triple"), r"unknown cache \(--cache\) 'triple'"),
    (dict(threshold=0.0), r"threshold \(--threshold\) must be"),
    (dict(threshold=1.5), r"threshold \(--threshold\) must be"),
    (dict(threshold=0.9, remasking="random"), "probability-valued"),
    (dict(refresh_every=2), r"refresh_every \(--refresh-every\) needs a cache"),
    (dict(cache="dual", refresh_every=0), r"refresh_every \(--refresh-every\) must be"),
])
def test_bad_fast_options_are_one_clear_error(bb, kw, msg):
    with pytest.raises(TimeromeError, match=msg):
        generate(bb, _prompt(bb), steps=8, gen_length=8, block_length=8, **kw)


def test_evaluation_generations_take_the_options(bb):
    from timerome.data.tofu import load_split
    from timerome.evaluation.evaluator import generate_answers

    rows = load_split("forget01", "embedded")[:6]
    q, a = [r["question"] for r in rows], [r["answer"] for r in rows]
    exact = generate_answers(bb, q, a)
    assert generate_answers(bb, q, a, cache="dual", refresh_every=1) == exact
    fast = generate_answers(bb, q, a, cache="dual", threshold=0.9)
    assert len(fast) == len(exact) and all(isinstance(t, str) and t for t in fast)


def test_generate_command_takes_the_options():
    from typer.testing import CliRunner

    from timerome.cli import app

    runner = CliRunner()
    prompt = PROMPTS[0]
    sizes = ["--steps", "16", "--gen-length", "16", "--block-length", "8"]
    res = runner.invoke(app, ["generate", prompt, *sizes, "--cache", "dual", "--refresh-every", "1"])
    assert res.exit_code == 0, res.output
    exact = runner.invoke(app, ["generate", prompt, *sizes])
    assert res.output == exact.output  # refreshed at every step: the exact answer
    fast = runner.invoke(app, ["generate", prompt, *sizes[2:], "--cache", "prefix", "--threshold", "0.9"])  # no --steps
    assert fast.exit_code == 0 and "Quielson" in fast.output, fast.output
    bad = runner.invoke(app, ["generate", prompt, "--cache", "triple"])
    assert bad.exit_code == 2 and "unknown cache (--cache) 'triple'" in bad.output and "Traceback" not in bad.output


def test_lm_eval_model_takes_the_options(bb):
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: pip install -e '.[test]'")
    from timerome.integrations.lm_eval_model import TimeromeLM

    class Req:
        def __init__(self, *args):
            self.args = args

    reqs = [Req(p, {"until": ["."], "max_gen_toks": 8}) for p in PROMPTS]
    exact = TimeromeLM(backbone=bb).generate_until(reqs, disable_tqdm=True)
    refreshed = TimeromeLM(backbone=bb, cache="dual", refresh_every=1).generate_until(reqs, disable_tqdm=True)
    assert refreshed == exact and all(exact)
    fast = TimeromeLM(backbone=bb, cache="prefix", threshold=0.9).generate_until(reqs, disable_tqdm=True)
    assert len(fast) == 2 and all(isinstance(t, str) for t in fast)
    with pytest.raises(TimeromeError, match="unknown cache"):
        TimeromeLM(backbone=bb, cache="triple")
    with pytest.raises(TimeromeError, match=r"threshold \(--threshold\) must be"):
        TimeromeLM(backbone=bb, threshold=2.0)


def test_eval_command_takes_the_options():
    import json

    from typer.testing import CliRunner

    from timerome.cli import app

    runner = CliRunner()
    args = ["eval", "--splits", "forget", "--n-mc", "1", "--json"]
    exact = runner.invoke(app, args)
    refreshed = runner.invoke(app, args + ["--cache", "dual", "--refresh-every", "1"])
    assert exact.exit_code == 0 and refreshed.exit_code == 0, refreshed.output
    a, b = json.loads(exact.stdout), json.loads(refreshed.stdout)
    assert b["sampler"] == {"cache": "dual", "refresh_every": 1} and a["sampler"] == {}
    assert b["metrics"]["ForgetROUGE"] == a["metrics"]["ForgetROUGE"] > 0.5
    bad = runner.invoke(app, args + ["--threshold", "1.5"])
    assert bad.exit_code == 2 and "threshold (--threshold) must be" in bad.output and "Traceback" not in bad.output
