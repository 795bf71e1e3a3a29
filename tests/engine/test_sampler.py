"""generate() against a literal, slow transcription of the LLaDA sampler (as paraphrased in
shared/notes/reference-algorithms.md), on a tiny seeded bidirectional transformer."""

import math

import pytest
import torch
from toy import MASK
from toy import ToyBackbone as _Toy

from timerome.engine.sampler import denoise_step, generate, reveal_masked, row_max, transfer_schedule
from timerome.errors import TimeromeError


def ToyBackbone(**kw):
    return _Toy(never_predict_mask=True, **kw)


class State:
    def __init__(self):
        self.step = -1


# ------------------------------------------------------------------------------ the transcription


def reference_generate(model, prompt, steps, gen_length, block_length, temperature, cfg_scale, remasking,
                       generator):
    """One step at a time, exactly as the notes describe; deliberately unoptimised."""
    B, P = prompt.shape
    x = torch.full((B, P + gen_length), MASK, dtype=torch.long)
    x[:, :P] = prompt
    prompt_index = x != MASK
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    for blk in range(num_blocks):
        lo, hi = P + blk * block_length, P + (blk + 1) * block_length
        schedule = []
        for b in range(B):
            m = int((x[b, lo:hi] == MASK).sum())
            schedule.append([m // steps_per_block + (1 if i < m % steps_per_block else 0)
                             for i in range(steps_per_block)])
        for i in range(steps_per_block):
            mask_index = x == MASK
            if cfg_scale > 0:
                un_x = x.clone()
                un_x[prompt_index] = MASK
                both = model.logits(torch.cat([x, un_x], dim=0))
                cond, uncond = both[:B], both[B:]
                logits = uncond + (cfg_scale + 1) * (cond - uncond)
            else:
                logits = model.logits(x)
            if temperature == 0:
                x0 = torch.argmax(logits, dim=-1)
            else:
                l64 = logits.to(torch.float64)
                u = torch.rand(l64.shape, dtype=torch.float64, generator=generator)
                x0 = torch.argmax(l64.exp() / (-torch.log(u)) ** temperature, dim=-1)
            conf = reference_confidence(logits, x0, remasking, temperature, generator)
            conf[:, hi:] = -math.inf
            for b in range(B):
                for j in range(x.shape[1]):
                    if not mask_index[b, j]:
                        x0[b, j] = x[b, j]
                        conf[b, j] = -math.inf
            for b in range(B):
                chosen = torch.topk(conf[b], k=schedule[b][i]).indices
                for j in chosen.tolist():
                    x[b, j] = x0[b, j]
    return x


def reference_confidence(logits, x0, remasking, temperature, generator):
    B, L, _ = logits.shape
    if remasking == "random":
        return torch.rand((B, L), generator=generator)
    if remasking == "low_confidence":
        p = torch.softmax(logits.to(torch.float64), dim=-1)
    else:  # Dream: the tempered distribution
        p = torch.softmax(logits.to(torch.float64) / (temperature if temperature > 0 else 1.0), dim=-1)
    conf = torch.empty(B, L, dtype=torch.float64)
    for b in range(B):
        for j in range(L):
            pj = p[b, j]
            if remasking in ("low_confidence", "maskgit_plus"):
                conf[b, j] = pj[x0[b, j]]
            elif remasking == "margin":
                s = torch.sort(pj, descending=True).values
                conf[b, j] = s[0] - s[1]
            elif remasking == "entropy":
                conf[b, j] = sum(float(q) * math.log(float(q)) for q in pj if q > 0)
    return conf


# ------------------------------------------------------------------------------ tests

PROMPT = torch.tensor([[3, 17, 8, 22, 5], [40, 2, 2, 11, 30]])

CASES = [  # steps, gen_length, block_length, temperature, cfg_scale, remasking
    (8, 8, 8, 0.0, 0.0, "low_confidence"),
    (4, 16, 16, 0.0, 0.0, "low_confidence"),  # several tokens per step
    (6, 8, 8, 0.0, 0.0, "low_confidence"),  # remainder front-loaded
    (5, 16, 16, 0.0, 0.0, "low_confidence"),
    (8, 16, 4, 0.0, 0.0, "low_confidence"),  # four blocks
    (8, 8, 8, 0.7, 0.0, "low_confidence"),
    (8, 16, 8, 1.0, 0.0, "low_confidence"),
    (8, 8, 8, 0.0, 1.5, "low_confidence"),
    (8, 16, 8, 0.8, 0.5, "low_confidence"),
    (8, 8, 8, 0.0, 0.0, "random"),
    (8, 16, 8, 0.9, 0.0, "random"),
    (8, 16, 8, 0.0, 1.0, "random"),
    (8, 16, 8, 0.0, 0.0, "maskgit_plus"),
    (8, 16, 8, 0.0, 0.0, "margin"),
    (8, 16, 8, 0.0, 0.0, "entropy"),
    (8, 16, 8, 0.6, 0.0, "maskgit_plus"),
    (8, 16, 8, 0.6, 0.0, "margin"),
    (8, 16, 8, 0.6, 1.0, "entropy"),
]


@pytest.mark.parametrize("steps,gen_length,block_length,temperature,cfg_scale,remasking", CASES)
def test_matches_reference(steps, gen_length, block_length, temperature, cfg_scale, remasking):
    model = ToyBackbone()
    kw = dict(steps=steps, gen_length=gen_length, block_length=block_length, temperature=temperature,
              cfg_scale=cfg_scale, remasking=remasking)
    ours = generate(model, PROMPT, generator=torch.Generator().manual_seed(11), **kw)
    ref = reference_generate(model, PROMPT, generator=torch.Generator().manual_seed(11), **kw)
    assert ours.shape == (2, PROMPT.shape[1] + gen_length)
    assert torch.equal(ours, ref)
    assert torch.equal(ours[:, :PROMPT.shape[1]], PROMPT)
    assert not (ours == MASK).any()


def test_masks_inside_the_prompt_compete():
    model = ToyBackbone()
    prompt = torch.tensor([[3, MASK, 8, 22, MASK]])
    kw = dict(steps=4, gen_length=8, block_length=8, temperature=0.0, cfg_scale=0.0, remasking="low_confidence")
    ours = generate(model, prompt, **kw)
    ref = reference_generate(model, prompt, generator=None, **kw)
    assert torch.equal(ours, ref)
    # prompt masks may be filled; the budget is fixed, so exactly two masks remain somewhere
    assert int((ours == MASK).sum()) == 2


def test_the_toy_and_the_options_matter():
    """Guards against a vacuous match: different settings give different tokens on the toy."""
    model = ToyBackbone()
    base = dict(steps=8, gen_length=16, temperature=0.0, cfg_scale=0.0)
    one_block = generate(model, PROMPT, block_length=16, **base)
    four_blocks = generate(model, PROMPT, block_length=4, **base)
    assert not torch.equal(one_block, four_blocks)
    assert not torch.equal(one_block[0, 5:], one_block[1, 5:])  # the prompt matters
    assert not torch.equal(one_block, generate(model, PROMPT, block_length=16, remasking="random", **base))
    hot = [generate(model, PROMPT, steps=8, gen_length=16, block_length=16, temperature=1.0,
                    generator=torch.Generator().manual_seed(s)) for s in (0, 1)]
    assert not torch.equal(hot[0], hot[1])


def test_transfer_schedule():
    sched = transfer_schedule(torch.tensor([10, 3, 0, 8]), 4)
    assert sched.tolist() == [[3, 3, 2, 2], [1, 1, 1, 0], [0, 0, 0, 0], [2, 2, 2, 2]]
    counts = torch.arange(0, 40)
    sched = transfer_schedule(counts, 7)
    assert torch.equal(sched.sum(1), counts)
    assert ((sched[:, :-1] - sched[:, 1:]) >= 0).all()  # front-loaded
    assert (sched.max(1).values - sched.min(1).values <= 1).all()


@pytest.mark.parametrize("cfg_scale", [0.0, 2.0])
def test_state_step_once_per_forward(cfg_scale):
    model, state = ToyBackbone(), State()
    model.state = state
    seen = []
    out = generate(model, PROMPT, steps=12, gen_length=12, block_length=4, cfg_scale=cfg_scale, state=state,
                   on_step=lambda k, x: seen.append((k, x)))
    assert [s for _, s in model.calls] == list(range(12))
    assert all(b == (4 if cfg_scale else 2) for b, _ in model.calls)  # cond + uncond: one forward
    assert [k for k, _ in seen] == list(range(12))
    n_masked = [int((x == MASK).sum()) for _, x in seen]
    assert n_masked == sorted(n_masked, reverse=True) and n_masked[-1] == 0
    assert torch.equal(seen[-1][1], out)


def test_deterministic_default_generator():
    model = ToyBackbone()
    kw = dict(steps=8, gen_length=8, block_length=8, temperature=0.9, remasking="random")
    a, b = generate(model, PROMPT, **kw), generate(model, PROMPT, **kw)
    assert torch.equal(a, b)
    assert torch.equal(a, generate(model, PROMPT, generator=torch.Generator().manual_seed(0), **kw))


def test_one_dimensional_prompt():
    model = ToyBackbone()
    kw = dict(steps=4, gen_length=8, block_length=8)
    assert torch.equal(generate(model, PROMPT[0].tolist(), **kw), generate(model, PROMPT[:1], **kw))


def test_padding_is_never_revealed():
    model = ToyBackbone()
    prompt = torch.tensor([[MASK, MASK, 3, 17, 8], [40, 2, 2, 11, 30]])  # row 0 left-padded with MASK
    am = torch.tensor([[False, False, True, True, True], [True] * 5])
    out = generate(model, prompt, steps=8, gen_length=8, block_length=8, attention_mask=am)
    assert (out[0, :2] == MASK).all() and not (out[:, 5:] == MASK).any()


@pytest.mark.parametrize("where", ["answer", "prompt"])
def test_nonfinite_logits_where_it_writes_are_refused(where):
    """Stop 81: finite weights whose activations overflow gave NaN logits, and generate wrote arbitrary tokens
    (the CLI an empty answer, exit 0). NaN at a position it writes is refused after the generation (no step
    waits to ask); at the prompt's positions, which it never writes, the answer is the model's as before."""
    model = ToyBackbone()
    prompt = torch.tensor([[3, 17, 8, 11]])
    clean = generate(model, prompt, steps=4, gen_length=4, block_length=4)
    real = model.logits

    def broken(ids, attention_mask=None):
        out = real(ids, attention_mask).clone()
        out[:, -1 if where == "answer" else 0, 5] = torch.nan
        return out

    model.logits = broken
    if where == "answer":
        with pytest.raises(TimeromeError, match="not finite .* where it writes the answer"):
            generate(model, prompt, steps=4, gen_length=4, block_length=4)
    else:
        assert torch.equal(generate(model, prompt, steps=4, gen_length=4, block_length=4), clean)


@pytest.mark.parametrize("kw,match", [
    (dict(gen_length=10, block_length=4), "multiple of block_length"),
    (dict(steps=6, gen_length=16, block_length=4), "not divisible by the number of blocks"),
    (dict(gen_length=64, block_length=64, steps=64), "exceeds the model's context"),
    (dict(remasking="lowest"), "unknown remasking"),
    (dict(temperature=-0.1), "temperature"),
    (dict(steps=0), ">= 1"),
])
def test_bad_inputs(kw, match):
    args = dict(steps=8, gen_length=8, block_length=8) | kw
    with pytest.raises(TimeromeError, match=match):
        generate(ToyBackbone(), PROMPT, **args)


def test_an_empty_prompt_generates_unconditionally_and_a_blank_text_or_no_row_is_refused():
    """Ids of no token are an unconditional generation (lm-eval's empty context: a mask standing in for
    it took a denoising step); a blank text is a mistake, and so is a batch of no rows."""
    x = generate(ToyBackbone(), torch.zeros(1, 0, dtype=torch.long), steps=4, gen_length=8, block_length=8)
    assert x.shape == (1, 8) and not bool((x == ToyBackbone().mask_id).any())
    with pytest.raises(TimeromeError, match="prompt text is blank"):
        generate(ToyBackbone(), "  ", steps=4, gen_length=8, block_length=8)
    with pytest.raises(TimeromeError, match="no rows"):
        generate(ToyBackbone(), torch.zeros(0, 3, dtype=torch.long), steps=4, gen_length=8, block_length=8)
    from timerome.engine.sampler import continuations

    with pytest.raises(TimeromeError, match="prompt 1 of 2 is blank"):  # the metrics' questions: never unconditional
        continuations(ToyBackbone(), ["Who ?", " "], gen_length=8)


def test_bad_prompt_ids_are_refused_clearly():
    kw = dict(steps=4, gen_length=8, block_length=8)
    model = ToyBackbone()
    model.vocab_size = 64
    with pytest.raises(TimeromeError, match="lie in 0..63"):
        generate(model, [[1, 2, 64]], **kw)
    with pytest.raises(TimeromeError, match="lie in 0..63"):
        generate(model, [[-1, 2, 3]], **kw)
    with pytest.raises(TimeromeError, match="rows of one length"):
        generate(model, [[1, 2], [3]], **kw)


def test_text_prompt_on_the_embedded_model():
    from timerome import load_backbone

    bb = load_backbone()
    text = "Where was Isgor Quielson born ?"
    kw = dict(steps=4, gen_length=8, block_length=8)
    assert torch.equal(generate(bb, text, **kw), generate(bb, bb.encode(text), **kw))


def test_a_text_with_words_the_vocabulary_does_not_know_is_said_in_the_api_as_on_the_cli():
    """The API read such words as <|unk|> silently where the CLI warned (generate) or refused (an answer):
    log_likelihood scored "zzzqqq" as the unknown token's likelihood, -34.9 nats (review 59)."""
    import warnings

    from timerome import load_backbone, log_likelihood

    bb = load_backbone()
    kw = dict(steps=4, gen_length=8, block_length=8)
    with pytest.warns(UserWarning, match=r"does not know \('Zxqwv'\)"):
        generate(bb, "Where was Zxqwv born ?", **kw)
    with pytest.warns(UserWarning, match="'Zxqwv'"):
        log_likelihood(bb, "Where was Zxqwv born ?", "Pellmoor", n_mc=2)
    with pytest.raises(TimeromeError, match=r"the answer .*'zzzqqq'.* cannot encode"):
        log_likelihood(bb, "Where was Isgor Quielson born ?", "zzzqqq", n_mc=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # known words: nothing said
        generate(bb, "Where was Isgor Quielson born ?", **kw)
        log_likelihood(bb, "Where was Isgor Quielson born ?", "Isgor Quielson was born in Pellmoor .", n_mc=2)


@pytest.mark.parametrize("remasking", ["low_confidence", "margin"])
def test_reveal_from_the_masked_positions_logits_alone(remasking):
    """`reveal_masked` (the trace engine's step: logits at the masked positions only) commits what
    `denoise_step` commits from the full logits, with and without a threshold."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(5, 50, (4, 9), generator=g)
    masked = torch.rand(4, 9, generator=g) < 0.6
    masked[0] = False  # a row with nothing to reveal
    x[masked] = 1
    logits = torch.randn(4, 9, 50, generator=g) * 3
    n = torch.tensor([2, 1, 0, 9])
    for threshold in (None, 0.3):
        want = denoise_step(x, logits, masked, n, remasking=remasking, threshold=threshold)
        got = reveal_masked(x, logits[masked], masked, n, remasking=remasking, threshold=threshold)
        assert torch.equal(got, want)
    assert not torch.equal(want, x)


def _reference_reveal(x, logits, masked, n):
    """LLaDA's low-confidence step at temperature 0, literally: float64 softmax of every position,
    the argmax's probability, the n[b] most confident masked positions of row b revealed."""
    x0 = logits.argmax(-1)
    conf = torch.softmax(logits.to(torch.float64), -1).gather(-1, x0[..., None]).squeeze(-1)
    conf = torch.where(masked, conf, -torch.inf)
    keep = torch.zeros_like(masked)
    for b in range(x.shape[0]):
        if int(n[b]):
            keep[b, conf[b].topk(int(n[b])).indices] = True
    return torch.where(keep & masked, x0, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_float32_screen_reveals_what_the_float64_softmax_reveals(dtype):
    """`reveal_masked` orders a row's masked positions by a float32 sum with a proven error bound and
    falls back to the float64 softmax where the bound cannot settle the row: the tokens revealed are
    the reference's on random, confident (probabilities rounding to 1 in float64), tied (equal
    logit rows) and near-tied positions; and both paths are taken."""
    g = torch.Generator().manual_seed(5)
    screened = fell_back = 0
    import timerome.engine.sampler as sm

    real = sm._confidence
    calls = []
    sm._confidence = lambda *a: calls.append(1) or real(*a)
    try:
        for case in range(60):
            B, L, V = 3, 12, 200
            scale = (1.0, 5.0, 40.0)[case % 3]
            logits = (torch.randn(B, L, V, generator=g) * scale).to(dtype)
            if case % 4 == 1:  # exact ties: two positions of a row with the same logits
                logits[:, 3] = logits[:, 5]
            if case % 4 == 2:  # near ties: one logit moved by a float32 ulp
                logits[:, 7] = logits[:, 2]
                logits[:, 7, 0] = torch.nextafter(logits[:, 7, 0].float(), torch.tensor(1e9)).to(dtype)
            masked = torch.rand(B, L, generator=g) < 0.7
            masked[:, 2:8] = True
            x = torch.randint(5, V, (B, L), generator=g)
            x[masked] = 1
            n = torch.randint(1, 5, (B,), generator=g).clamp(max=masked.sum(1) - 1)
            calls.clear()
            got = reveal_masked(x, logits[masked], masked, n)
            fell_back += bool(calls)
            screened += not calls
            assert torch.equal(got, _reference_reveal(x, logits, masked, n)), case
    finally:
        sm._confidence = real
    assert screened > 5 and fell_back > 5, (screened, fell_back)


def test_head_read_gives_logsumexp_bit_for_bit_and_falls_back_on_infinite_logits():
    from timerome.engine.sampler import HeadRead

    g = torch.Generator().manual_seed(0)
    buffer = None
    for M, V in ((600, 1170), (9, 50), (700, 1170)):
        lg = torch.randn(M, V, generator=g) * 7
        assert torch.equal(HeadRead(lg).log_normaliser(), lg.logsumexp(-1))
        # a kept buffer (grown where it is short) gives the same passes
        grown = HeadRead.buffer_for(lg, buffer)
        assert grown.numel() >= lg.numel() and (buffer is None or (grown is buffer) == (buffer.numel() >= lg.numel()))
        buffer = grown
        kept, fresh = HeadRead(lg, buffer), HeadRead(lg)
        assert torch.equal(kept.exp, fresh.exp) and kept.exp.data_ptr() == buffer.data_ptr()
        assert torch.equal(kept.log_normaliser(), lg.logsumexp(-1))
        assert torch.equal(kept.tail_mass(), fresh.tail_mass())
    x = torch.tensor([[1, 1, 1, 1]])
    masked = x == 1
    logits = torch.randn(1, 4, 20, generator=g)
    logits[0, 1, 3] = torch.inf  # the reference's softmax gives NaN there: the float64 path decides, as it would
    n = torch.tensor([2])
    assert torch.equal(reveal_masked(x, logits[masked], masked, n), _reference_reveal(x, logits, masked, n))


def test_rows_with_different_budgets_break_ties_as_the_reference_does():
    """A row's revealed positions do not depend on the other rows' budgets: with every confidence
    exactly 1.0 in float64 (a 60-nat gap), torch.topk breaks the ties by k, and each row takes the
    reference's torch.topk(conf[b], k[b]) (found by review: the first k[b] of one topk(max k) differ)."""
    B, L, V = 2, 36, 8
    logits = torch.zeros(B, L, V)
    logits[:, :, 3] = 60.0
    x = torch.full((B, L), 1)
    masked = torch.ones(B, L, dtype=torch.bool)
    n = torch.tensor([1, 17])
    for screen in (True, False):
        got = reveal_masked(x, logits[masked], masked, n, screen=screen)
        assert torch.equal(got, _reference_reveal(x, logits, masked, n))
        assert torch.equal(got[:1], reveal_masked(x[:1], logits[:1][masked[:1]], masked[:1], n[:1], screen=screen))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("V", [7, 255, 256, 300, 383, 1170, 5000])
def test_row_max_is_max_bit_for_bit(V, dtype):
    """row_max gives torch's max(-1), values and first indices, on ties, infinities, NaN rows,
    vocabularies not a multiple of its block, batched and non-contiguous inputs."""
    g = torch.Generator().manual_seed(V)
    x = torch.randn(2, 23, V, generator=g).to(dtype)
    x[0, 1] = (x[0, 1] * 2).round()              # many ties
    x[0, 2] = -torch.inf                           # all -inf: index 0
    x[0, 3, V // 2] = torch.inf
    x[0, 4, -1] = 1e4                              # the maximum in the last, partial block
    x[0, 5, V // 3:] = x[0, 5].max()               # a tie from a block boundary onwards
    x[0, 6] = 0.0
    x[0, 6, :V // 2] = -0.0                        # signed zeros: the first maximum's own sign (-0.0)
    x[1, :, :] = (x[1] * 3).round()                # ties in every row
    for t in (x, x.transpose(0, 1), x[:, :, :].flip(-1)):
        want, got = t.max(-1), row_max(t)
        assert torch.equal(got.indices, want.indices)
        assert torch.equal(got.values, want.values) and torch.equal(got.values.signbit(), want.values.signbit())
    y = x.clone()
    y[0, 7, V // 4] = float("nan")                 # a row holding a NaN: what max gives
    want, got = y.max(-1), row_max(y)
    assert torch.equal(got.indices, want.indices) and bool(got.values[0, 7].isnan())


def test_a_large_temperature_still_draws_from_the_vocabulary():
    """(-log U)^T overflowed float64 at T = 300: every score inf or 0, the argmax the first id (the mask among
    them), the answer empty. Rows the reference's form cannot score are drawn in log space; the others as before."""
    from timerome.engine.sampler import _sample

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 50, generator=g)
    for T in (300.0, 1e4):
        x0 = _sample(logits, T, torch.Generator().manual_seed(1))
        u = torch.rand(logits.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        want = (logits.double() - T * torch.log(-torch.log(u))).argmax(-1)
        assert torch.equal(x0, want) and len(set(x0.view(-1).tolist())) > 4
    u = torch.rand(logits.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref = (logits.double().exp() / (-torch.log(u)) ** 0.9).argmax(-1)  # the reference's form, where it is finite
    assert torch.equal(_sample(logits, 0.9, torch.Generator().manual_seed(1)), ref)


def test_an_autoregressive_generation_stops_at_its_end_of_text(tmp_path):
    """Review 91: on SmolLM2 the API's generate ran all its forwards past the end-of-text, into the next chat
    turns. A row that writes a special token is finished (the placeholder after it), and the forwards stop
    once every row is; a batch gives each row what it gives alone."""
    from timerome.backbones import load_backbone
    from timerome.backbones.tiny import make_tiny_checkpoint
    from timerome.engine.sampler import generate

    bb = load_backbone(make_tiny_checkpoint("llama", tmp_path / "ar", layers=2))
    eos = bb.tokenizer.eos_token_id
    p = bb.encode("the author was born in")
    forwards = []
    real_next = bb.next_logits

    def ending(ids, mask=None):  # the model's logits, with the end-of-text forced at the third token
        forwards.append(ids.shape[1])
        out = real_next(ids, mask)
        if ids.shape[1] == len(p) + 2:
            out = out.clone()
            out[:, eos] = out.max() + 10
        return out

    bb.next_logits = ending
    x = generate(bb, torch.tensor([p]), gen_length=8)
    assert x[0, len(p) + 2] == eos and (x[0, len(p) + 3:] == bb.mask_id).all()
    assert len(forwards) == 3  # nothing after the end-of-text
    forwards.clear()
    q = bb.encode("what did the author write")
    L = max(len(p), len(q))
    ids = torch.tensor([[0] * (L - len(p)) + p, [0] * (L - len(q)) + q])
    att = torch.tensor([[0] * (L - len(p)) + [1] * len(p), [0] * (L - len(q)) + [1] * len(q)]).bool()
    bb.next_logits = real_next
    alone = generate(bb, torch.tensor([q]), gen_length=8)
    both = generate(bb, ids, gen_length=8, attention_mask=att)
    assert both[1, L:].tolist() == alone[0, len(q):].tolist()


def test_nonfinite_next_token_logits_are_refused_on_an_autoregressive_model(tmp_path):
    """The same on an autoregressive model: NaN in the logits of a token it writes is refused."""
    from timerome.backbones import load_backbone
    from timerome.backbones.tiny import make_tiny_checkpoint

    bb = load_backbone(make_tiny_checkpoint("llama", tmp_path / "ar", layers=2))
    p = torch.tensor([bb.encode("the author was born in")])
    real_next = bb.next_logits

    def broken(ids, mask=None):
        out = real_next(ids, mask).clone()
        out[:, 7] = torch.nan
        return out

    bb.next_logits = broken
    with pytest.raises(TimeromeError, match="logits of ar are not finite .* in float32"):
        generate(bb, p, gen_length=4)
