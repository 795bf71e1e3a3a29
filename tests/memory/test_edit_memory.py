"""EditMemory, the single-fact gate, capture and whitening (tiny models; the embedded one at the end)."""

from types import SimpleNamespace

import pytest
import torch

from timerome import TimeromeError, load_backbone
from timerome.backbones.loading import DEFAULT_MODEL_DIR
from timerome.data.facts import Fact
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import fact_id
from timerome.engine.hooks import Intervention, TraceState, capture
from timerome.memory.capture import capture_facts
from timerome.memory.edit_memory import EditMemory
from timerome.memory.gated_edit import GatedEdit, gated_delta
from timerome.memory.whitening import ResidualStats, residual_stats

SITE = (1, "resid")
TARGET = "night rain"  # the tiny vocabulary has no "I don't know."
BACKGROUND = ["the author was born in city of books", "what did her first novel win ? award",
              "who wrote many novels about sea rain night", "when did his mystery win the prize ?",
              "where is the author of poetry born ?", "did she write her first book about the sea ?"]


@pytest.fixture(scope="module")
def bb(tiny_bb):
    return tiny_bb


@pytest.fixture(scope="module")
def other_bb(tiny_other_bb):
    return tiny_other_bb


def facts3():
    return [Fact("the author", "where was the author born ?", "city of books", fact_id="a"),
            Fact("her", "what did her first novel win ?", "award", fact_id="b"),
            Fact("his", "what genre did his novels have ?", "mystery poetry", fact_id="c")]


@pytest.fixture(scope="module")
def stats(bb):
    return residual_stats(bb, SITE, BACKGROUND)


def n_hooks(bb):
    return sum(len(m._forward_hooks) for m in bb.model.modules())


def ids_of(bb, text="where was the author born ? city"):
    return torch.tensor([bb.encode(text)])


def synthetic(n, H, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, H, generator=g, dtype=torch.float64) * scale,
            torch.randn(n, H, generator=g, dtype=torch.float64))


def vector_memory(bb, U, D, ids=None, **kw):
    kw.setdefault("key_metric", "paper")
    kw.setdefault("alpha", 1.0)
    m = EditMemory(bb, SITE, **kw)
    return m.add_vectors(U, D, ids or [f"f{i}" for i in range(len(U))])


def random_stats(H, seed=3):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(4 * H, H, generator=g, dtype=torch.float64)
    return ResidualStats(SITE[0], SITE[1], torch.randn(H, generator=g, dtype=torch.float64),
                         X.T @ X / (4 * H) + 0.1 * torch.eye(H, dtype=torch.float64), 4 * H, 0.0)


# ------------------------------------------------------------------------------ capture


def test_coordinate_checks(bb):
    assert Coordinate.of((1, "resid", -1)).step is None
    assert Coordinate.of((-1, "mlp")).on(bb).layer == bb.n_layers - 1
    with pytest.raises(TimeromeError, match="hook point"):
        Coordinate(1, "ffn")
    with pytest.raises(TimeromeError, match="out of range"):
        EditMemory(bb, (7, "resid"), key_metric="paper")


def test_coordinate_from_a_tracing_selection():
    from timerome.tracing.selection import Candidate

    c = Coordinate.of(Candidate(Coordinate(2, "mlp", 5), score=1.0, mean_abs_tie=1.0, neighbour_abs_tie=0.0))
    assert c == Coordinate(2, "mlp", None)  # the traced step is not the edit step: k* = -1


def test_capture_matches_unbatched_hooks(bb):
    f = facts3()
    cap = capture_facts(bb, f, SITE, target=TARGET)
    # by hand for fact 0: "where was the author born ?" -> subject tokens 2, 3
    p, o, t = bb.encode(f[0].prompt), bb.encode(f[0].object), bb.encode(TARGET)
    with torch.no_grad(), capture(bb, [SITE]) as store:
        bb.logits(torch.tensor([p + o]))
        bb.logits(torch.tensor([p + t]))
    h_o, h_t = store[SITE][0][0].double(), store[SITE][1][0].double()
    P = len(p)
    torch.testing.assert_close(cap.keys[0], h_o[2:4].mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cap.v_orig[0], h_o[P:].mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cap.v_target[0], h_t[P:].mean(0), atol=1e-5, rtol=1e-5)
    # batching (padding + attention mask) changes nothing
    one = capture_facts(bb, f, SITE, target=TARGET, batch_size=1)
    for a, b in ((cap.keys, one.keys), (cap.deltas, one.deltas)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_capture_is_batched(bb):
    forwards = []
    with Intervention(bb, {(0, "resid"): lambda h, s: forwards.append(h.shape[0])}):
        capture_facts(bb, facts3(), SITE, target=TARGET, batch_size=32)
    assert forwards == [6]  # 3 facts x (object, target) in ONE forward


def test_residual_stats_are_mean_and_cov(bb):
    st = residual_stats(bb, SITE, BACKGROUND[:3], masked_copies=0, shrinkage=0.1, batch_size=2)
    xs = []
    with torch.no_grad(), capture(bb, [SITE]) as store:
        for t in BACKGROUND[:3]:
            bb.logits(ids_of(bb, t))
    xs = torch.cat([h[0] for h in store[SITE]]).double()
    torch.testing.assert_close(st.mean, xs.mean(0), atol=1e-6, rtol=1e-5)
    cov = torch.cov(xs.T)  # fewer tokens than dimensions: singular until shrunk toward the mean variance
    shrunk = 0.9 * cov + 0.1 * cov.diagonal().mean() * torch.eye(len(cov), dtype=torch.float64)
    torch.testing.assert_close(st.cov, shrunk, atol=1e-6, rtol=1e-4)
    assert st.n_tokens == len(xs)


# ------------------------------------------------------------------------------ algebra


@pytest.mark.parametrize("n_facts", [10, 50])  # F < H uses the [F, H] coefficients, F > H the [H, H] map
def test_dual_identity_equals_primal_ridge(bb, n_facts):
    H, lam = bb.hidden_size, 0.7
    U, D = synthetic(n_facts, H)
    m = vector_memory(bb, U, D, lam_absolute=lam)
    h = torch.randn(4, 3, H, dtype=torch.float64)
    # primal: M* = argmin sum |M u - d|^2 + lam |M|_F^2 = D^T U (U^T U + lam I)^-1, an [H, H] map
    M = torch.linalg.solve(U.T @ U + lam * torch.eye(H, dtype=torch.float64), U.T @ D).T
    torch.testing.assert_close(m.delta(h), h @ M.T, atol=1e-9, rtol=1e-8)
    m.alpha = 2.5
    torch.testing.assert_close(m.delta(h), 2.5 * h @ M.T, atol=1e-9, rtol=1e-8)


def test_whitened_is_paper_metric_on_whitened_keys(bb):
    H, lam = bb.hidden_size, 0.3
    U, D = synthetic(12, H, scale=3.0)
    st = random_stats(H)
    white = vector_memory(bb, U, D, lam_absolute=lam, key_metric="whitened", background=st)
    Wt = torch.linalg.inv(torch.linalg.cholesky(st.cov)).T  # z = (x - mu) Wt has identity covariance
    paper = vector_memory(bb, (U - st.mean) @ Wt, D, lam_absolute=lam)
    h = torch.randn(5, H, dtype=torch.float64)
    torch.testing.assert_close(white.delta(h), paper.delta((h - st.mean) @ Wt), atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("key_metric", ["paper", "whitened"])
def test_streaming_insert_and_remove_equal_batch_solve(bb, key_metric):
    H = bb.hidden_size
    U, D = synthetic(40, H, seed=1)
    kw = dict(lam_absolute=0.5, alpha=1.0, key_metric=key_metric, background=random_stats(H))
    batch = vector_memory(bb, U, D, **kw)
    stream = EditMemory(bb, SITE, **kw)
    for i in range(40):
        stream.add_vectors(U[i:i + 1], D[i:i + 1], [f"f{i}"])
    h = torch.randn(6, H, dtype=torch.float64)
    for name in ("G", "A", "W"):
        a, b = getattr(batch.ridge, name), getattr(stream.ridge, name)
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(stream.delta(h), batch.delta(h), atol=1e-9, rtol=1e-7)
    # removal downdates to the batch solve of what is left
    gone = [3, 17, 18, 39]
    stream.remove([f"f{i}" for i in gone])
    left = [i for i in range(40) if i not in gone]
    rest = vector_memory(bb, U[left], D[left], [f"f{i}" for i in left], **kw)
    assert stream.fact_ids == rest.fact_ids
    torch.testing.assert_close(stream.ridge.G, rest.ridge.G, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(stream.delta(h), rest.delta(h), atol=1e-9, rtol=1e-7)


def test_insertion_order_does_not_change_the_memory(bb):
    H = bb.hidden_size
    U, D = synthetic(20, H, seed=2)
    ids = [f"f{i}" for i in range(20)]
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    a = vector_memory(bb, U, D, ids, lam_absolute=1.0)
    b = EditMemory(bb, SITE, key_metric="paper", alpha=1.0, lam_absolute=1.0)
    for chunk in perm.split(7):  # a different order, in blocks of several facts
        b.add_vectors(U[chunk], D[chunk], [ids[i] for i in chunk])
    assert b.fact_ids == [ids[i] for i in perm]
    torch.testing.assert_close(b.ridge.G, a.ridge.G[perm][:, perm], atol=1e-10, rtol=1e-8)
    h = torch.randn(8, H, dtype=torch.float64)
    torch.testing.assert_close(b.delta(h), a.delta(h), atol=1e-10, rtol=1e-8)


def test_q_semantics(bb):
    H = bb.hidden_size
    U, D = synthetic(6, H, seed=4)
    m = vector_memory(bb, U, D, lam_absolute=0.2)
    h = torch.randn(10, H, dtype=torch.float64)
    dense = m.delta(h)
    c = h @ (torch.linalg.inv(U @ U.T + 0.2 * torch.eye(6, dtype=torch.float64)) @ U).T  # [10, F]
    m.q = 1
    best = c.abs().argmax(1)
    expect = c.gather(1, best[:, None]) * D[best]  # only each token's largest-|c| fact
    torch.testing.assert_close(m.delta(h), expect, atol=1e-9, rtol=1e-8)
    m.q = 6
    torch.testing.assert_close(m.delta(h), dense, atol=1e-9, rtol=1e-8)
    m.q = 7
    with pytest.raises(TimeromeError, match="q=7 exceeds"):
        m.delta(h)
    m.q, m.g_max = 0, 0.5
    torch.testing.assert_close(m.delta(h), c.clamp(0, 0.5) @ D, atol=1e-9, rtol=1e-8)


def test_gated_edit_formula_and_hook(bb):
    H = bb.hidden_size
    u, d = synthetic(2, H, seed=5)[0]
    h = torch.stack([2 * u, -u, 0.5 * u])
    got = gated_delta(h, u, d, alpha=2.0, g_max=1.0, eps=0.0)
    expect = torch.stack([2.0 * d, 0 * d, 1.0 * d])  # gates: clipped to g_max, clipped to 0, 0.5
    torch.testing.assert_close(got, expect.to(got.dtype), atol=1e-9, rtol=1e-9)
    edit = GatedEdit.from_fact(bb, facts3()[0], SITE, target=TARGET, alpha=3.0)
    ids, before = ids_of(bb), n_hooks(bb)
    with torch.no_grad():
        clean = bb.logits(ids)
        with edit.applied(bb):
            assert n_hooks(bb) == before + 1
            edited = bb.logits(ids)
    assert n_hooks(bb) == before
    assert not torch.allclose(clean, edited)


# ------------------------------------------------------------------------------ the hook


def test_hook_adds_delta_and_is_removed(bb, stats):
    m = EditMemory(bb, SITE, alpha=2.0, target=TARGET, background=stats).add(facts3())
    ids, before = ids_of(bb), n_hooks(bb)
    with torch.no_grad():
        clean = bb.logits(ids)
        with capture(bb, [SITE]) as plain:
            bb.logits(ids)
        with m.applied(bb), capture(bb, [SITE]) as seen:  # capture runs after the edit hook
            edited = bb.logits(ids)
        h = plain[SITE][0]
        torch.testing.assert_close(seen[SITE][0], h + m.delta(h))
        assert not torch.allclose(clean, edited)
        with pytest.raises(RuntimeError, match="boom"):
            with m.applied(bb):
                raise RuntimeError("boom")
        assert n_hooks(bb) == before
        torch.testing.assert_close(bb.logits(ids), clean, atol=0, rtol=0)


def test_step_restricted_edit_fires_only_at_k_star(bb, stats):
    m = EditMemory(bb, SITE, step=2, target=TARGET, background=stats).add(facts3())
    ids = ids_of(bb)
    with torch.no_grad():
        clean = bb.logits(ids)
        state = TraceState()
        with m.applied(bb, state) as st:
            assert st is state
            for k in range(4):
                state.step = k
                assert torch.equal(bb.logits(ids), clean) == (k != 2)


# ------------------------------------------------------------------------------ save / load


def test_save_load_round_trip(bb, stats, tmp_path):
    m = EditMemory(bb, SITE, alpha=1.5, lam=0.3, q=2, target=TARGET, background=stats).add(facts3())
    path = m.save(tmp_path / "mem.safetensors")
    back = EditMemory.load(path, bb)
    assert back.fact_ids == m.fact_ids and back.facts == m.facts
    assert (back.coordinate, back.alpha, back.lam, back.q, back.key_metric) == (m.coordinate, 1.5, 0.3, 2, "whitened")
    torch.testing.assert_close(back.stats.cov, stats.cov, atol=0, rtol=0)
    h = torch.randn(2, 7, bb.hidden_size)
    torch.testing.assert_close(back.delta(h), m.delta(h), atol=1e-6, rtol=1e-6)
    ids = ids_of(bb)
    with torch.no_grad(), m.applied(bb):
        a = bb.logits(ids)
    with torch.no_grad(), back.applied(bb):
        b = bb.logits(ids)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_load_refuses_other_model_and_damaged_files(bb, other_bb, stats, tmp_path):
    m = EditMemory(bb, SITE, target=TARGET, background=stats).add(facts3())
    path = m.save(tmp_path / "mem.safetensors")
    with pytest.raises(TimeromeError, match="built for another model"):
        EditMemory.load(path, other_bb)
    with pytest.raises(TimeromeError, match="another model"):
        with m.applied(other_bb):
            pass
    raw = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TimeromeError, match="truncated"):
        EditMemory.load(tmp_path / "cut.safetensors", bb)
    flipped = bytearray(raw)
    flipped[-5] ^= 0xFF  # a tensor byte: the header still parses
    (tmp_path / "bad.safetensors").write_bytes(bytes(flipped))
    with pytest.raises(TimeromeError, match="corrupt"):
        EditMemory.load(tmp_path / "bad.safetensors", bb)
    (tmp_path / "junk.safetensors").write_text("not a memory")
    with pytest.raises(TimeromeError):
        EditMemory.load(tmp_path / "junk.safetensors", bb)
    with pytest.raises(TimeromeError, match="does not exist"):
        EditMemory.load(tmp_path / "nope.safetensors", bb)


# ------------------------------------------------------------------------------ bad input


def test_bad_input_raises_and_leaves_model_and_memory_unchanged(bb, stats):
    ids, before = ids_of(bb), n_hooks(bb)
    with torch.no_grad():
        clean = bb.logits(ids)
    m = EditMemory(bb, SITE, target=TARGET, background=stats).add(facts3()[:1])
    G0 = m.ridge.G.clone()

    def nan_at_layer0(h, state):
        return torch.full_like(h, float("nan"))

    bad = {
        "empty": (lambda: m.add([]), "empty"),
        "no subject": (lambda: m.add([SimpleNamespace(subject="the sea", prompt="where was the author born ?",
                                                      object="city")]), "does not occur"),
        "unknown word": (lambda: m.add([Fact("her", "what did her write ?", "zebra")]), "cannot encode"),
        "duplicate": (lambda: m.add(facts3()[:1]), "already in the memory"),
        "q > F": (lambda: setattr(m, "q", 5) or m.applied(bb).__enter__(), "exceeds"),
        "negative lambda": (lambda: EditMemory(bb, SITE, lam=-1.0, key_metric="paper"), "lam"),
        "unknown metric": (lambda: EditMemory(bb, SITE, key_metric="cosine"), "key_metric"),
        "unknown id": (lambda: m.remove(["zzz"]), "no fact with id"),
        "no background": (lambda: EditMemory(bb, SITE, key_metric="whitened"), "background corpus"),
    }
    for name, (fn, msg) in bad.items():
        with pytest.raises(TimeromeError, match=msg):
            fn()
        m.q = 0
        assert n_hooks(bb) == before, name
        assert len(m) == 1 and torch.equal(m.ridge.G, G0), name
    with Intervention(bb, {(0, "resid"): nan_at_layer0}):
        with pytest.raises(TimeromeError, match="NaN/inf"):
            m.add(facts3()[1:])
    assert len(m) == 1 and n_hooks(bb) == before
    with pytest.raises(TimeromeError, match="empty"):
        EditMemory(bb, SITE, key_metric="paper").delta(torch.zeros(bb.hidden_size))
    with torch.no_grad():
        torch.testing.assert_close(bb.logits(ids), clean, atol=0, rtol=0)


def test_singular_system_with_lambda_zero(bb):
    H = bb.hidden_size
    U, D = synthetic(3, H, seed=6)
    m = vector_memory(bb, U, D, lam=0.0)  # independent keys: fine without ridge
    with pytest.raises(TimeromeError, match="singular"):
        m.add_vectors(U[:1], D[:1], ["again"])  # a repeated key makes U U^T singular
    assert len(m) == 3
    with pytest.raises(TimeromeError, match="singular"):
        vector_memory(bb, *synthetic(H + 1, H), lam=0.0)  # more facts than dimensions


def test_fact_ids_and_remove(bb):
    U, D = synthetic(4, bb.hidden_size, seed=7)
    m = vector_memory(bb, U, D)
    m.remove(["f1"])
    assert m.fact_ids == ["f0", "f2", "f3"]
    m.remove(["f0", "f2", "f3"])
    assert len(m) == 0
    assert fact_id(Fact("s", "s p", "o")) == fact_id(Fact("s", "s p", "o"))


# ------------------------------------------------------------------------------ the embedded model


def _embedded():
    if not (DEFAULT_MODEL_DIR / "config.json").exists():
        pytest.skip("the embedded default model is not built yet")
    torch.manual_seed(0)
    return load_backbone()


@pytest.fixture(scope="module")
def embedded():
    bb = _embedded()
    from timerome.data.facts import facts_from_rows
    from timerome.data.tofu import load_split

    forget = load_split("forget10", "embedded")[:4]
    retain = load_split("retain90", "embedded")[::225][:8]  # eight different authors
    facts, skipped = facts_from_rows(forget)
    assert not skipped
    return bb, facts, forget, retain


def _lp(bb, rows, memory=None):
    from contextlib import nullcontext

    from timerome.engine.likelihood import log_likelihood_batch

    prompts, answers = [bb.encode(r["question"]) for r in rows], [bb.encode(r["answer"]) for r in rows]
    with torch.no_grad(), (memory.applied(bb) if memory is not None else nullcontext()):
        lp = log_likelihood_batch(bb, prompts, answers, n_mc=4,
                                  generator=torch.Generator().manual_seed(0))
    return float(lp.mean())


def test_embedded_edit_forgets_forget_rows_not_retain_rows(embedded):
    bb, facts, forget, retain = embedded
    # whitened keys at the middle layer, every step, alpha 6 and lambda = H (the configuration this test
    # has always checked; the toolkit default, relative lam 8 at alpha 4, is calibrated on a whole
    # author's 20 facts and moves these 4 facts by only -0.5 nats: tests/evaluation/test_evaluation.py checks it)
    m = EditMemory(bb, alpha=6.0, lam_absolute=float(bb.hidden_size)).add(facts)
    d_forget = _lp(bb, forget, m) - _lp(bb, forget)
    d_retain = _lp(bb, retain, m) - _lp(bb, retain)
    assert d_forget < -5.0, (d_forget, d_retain)  # measured: -10.9
    assert abs(d_retain) < 0.1 * abs(d_forget), (d_forget, d_retain)  # measured: -0.35


def test_embedded_paper_metric_forget_lp_falls_with_alpha(embedded):
    bb, facts, forget, _ = embedded
    m = EditMemory(bb, key_metric="paper", lam_absolute=1.0).add(facts)  # the paper's lambda = 1
    lps = []
    for alpha in (0.0, 1.0, 2.0):
        m.alpha = alpha
        lps.append(_lp(bb, forget, m))
    assert lps[0] > lps[1] > lps[2], lps


def test_remove_then_add_again_equals_the_batch_solve(bb):
    # removing the newest facts moves nothing; what stays behind in the buffers must not leak
    H = bb.hidden_size
    U, D = synthetic(12, H, seed=3)
    kw = dict(lam_absolute=0.5, alpha=1.0, key_metric="paper")
    m = EditMemory(bb, SITE, **kw)
    m.add_vectors(U, D, [f"f{i}" for i in range(12)])
    h = torch.randn(5, H, dtype=torch.float64)
    for gone in (["f11"], ["f10", "f11"], ["f0"], ["f4", "f11"]):
        m.remove(gone)
        idx = [int(g[1:]) for g in gone]
        m.add_vectors(U[idx], D[idx], gone)
        order = [int(i[1:]) for i in m.fact_ids]
        ref = vector_memory(bb, U[order], D[order], m.fact_ids, **kw)
        torch.testing.assert_close(m.delta(h), ref.delta(h), atol=1e-9, rtol=1e-7)


def test_a_version_1_memory_file_still_loads(bb, stats, tmp_path):
    """Format 1 stored the absolute lambda as `lam`; it loads as lam_absolute, with the same update."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    m = EditMemory(bb, SITE, alpha=2.0, target=TARGET, background=stats).add(facts3())
    path = m.save(tmp_path / "new.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = json.loads(f.metadata()["timerome"]), {k: f.get_tensor(k) for k in f.keys()}
    meta["format"] = "timerome-edit-memory/1"
    meta["hyper"] = {k: v for k, v in meta["hyper"].items() if k not in ("lam_absolute", "key_scale", "lam_value")}
    meta["hyper"]["lam"] = m.lam_value
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata={"timerome": json.dumps(meta)})
    old = EditMemory.load(tmp_path / "old.safetensors", bb)
    assert old.lam_absolute == pytest.approx(m.lam_value) and old.lam_value == pytest.approx(m.lam_value)
    h = torch.randn(3, bb.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(old.delta(h), m.delta(h), atol=1e-9, rtol=1e-8)


def test_build_is_capture_scale_and_solve_and_an_empty_build_streams_to_the_same_memory(bb, stats):
    from timerome.memory.capture import capture_facts

    facts = facts3()
    built = EditMemory.build(bb, SITE, facts, key_metric="paper", target=TARGET)
    cap = capture_facts(bb, facts, SITE, target=TARGET)
    by_hand = EditMemory(bb, SITE, key_metric="paper", target=TARGET).scale_to(cap.keys)
    by_hand.add_vectors(cap.keys, cap.deltas, facts)
    assert built.fact_ids == ["a", "b", "c"] and built.key_scale == by_hand.key_scale
    torch.testing.assert_close(built.ridge.G, by_hand.ridge.G, rtol=0, atol=0)
    # empty, scaled on the facts a stream will bring: inserting them one by one gives the full memory
    stream = EditMemory.build(bb, SITE, [], scale_facts=facts, key_metric="whitened", background=stats, target=TARGET)
    assert len(stream) == 0 and stream.key_scale is not None
    for f in facts:
        stream.add([f])
    full = EditMemory.build(bb, SITE, facts, key_metric="whitened", background=stats, target=TARGET)
    assert stream.key_scale == full.key_scale
    h = torch.randn(4, bb.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(stream.delta(h), full.delta(h), atol=1e-9, rtol=1e-7)
