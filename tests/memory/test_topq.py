"""topq.TopQIndex: the same TopQ as scoring every fact, while scoring only a few."""

import pytest
import torch

from timerome.memory.topq import INT8_MAX, TopQIndex, top_q, top_q_combine


def gen(seed):
    return torch.Generator().manual_seed(seed)


def data(kind, F, H, dtype, seed=0):
    g = gen(seed)
    if kind == "gauss":
        A = torch.randn(F, H, generator=g, dtype=dtype)
    elif kind == "norms":        # row norms over six orders of magnitude
        A = torch.randn(F, H, generator=g, dtype=dtype) * torch.logspace(-3, 3, F, dtype=dtype)[:, None]
    elif kind == "lowrank":      # rows in a 3-dimensional subspace: many similar scores
        A = torch.randn(F, 3, generator=g, dtype=dtype) @ torch.randn(3, H, generator=g, dtype=dtype)
    elif kind == "outliers":     # a few huge coordinates, as raw residuals have
        A = torch.randn(F, H, generator=g, dtype=dtype)
        A[:, :2] *= 300
    else:                        # near-duplicates: ties within the screen's bound, so it gives up
        A = torch.randn(8, H, generator=g, dtype=dtype)[torch.randint(0, 8, (F,), generator=g)]
        A = A + 1e-4 * torch.randn(F, H, generator=g, dtype=dtype)
    x = torch.randn(48, H, generator=g, dtype=dtype)
    x[5] = 0.0                                                    # a token with every score 0
    D = torch.randn(F, H, generator=g, dtype=dtype)
    return A, x, D


def same_selection(idx, c, q):
    """idx [N, q] is a set of q largest |c| per row (equal as sets to topk's, no ties in these data)."""
    want = c.abs().topk(q, dim=1).indices.sort(1).values
    got = idx.sort(1).values
    zero = (c == 0).all(1)                                       # rows of zeros: any q facts are TopQ
    return torch.equal(got[~zero], want[~zero])


@pytest.mark.parametrize("scoring", ["auto", "pairs", "union"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", ["gauss", "norms", "lowrank", "outliers", "clusters"])
def test_index_gives_the_exact_topq(kind, dtype, scoring):
    F, H = 1000, 24                                              # 1000 = 31 blocks of 32 and a partial one
    A, x, D = data(kind, F, H, dtype)
    c = x @ A.T
    ix = TopQIndex(A, scoring=scoring)                           # the candidates scored pair by pair / by chunk
    for q in (1, 4, 7):
        idx, vals = ix.select(x, q)
        assert same_selection(idx, c, q), (kind, q)
        torch.testing.assert_close(vals, c.gather(1, idx), rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)
        ref = top_q_combine(c, q, D)
        scale = float(ref.abs().max())                           # float32 scores differ in the last bits
        tol = dict(rtol=0, atol=3e-6 * scale) if dtype == torch.float32 else dict(rtol=0, atol=1e-12 * scale)
        torch.testing.assert_close(ix.combine(x, q, D), ref, **tol)
        torch.testing.assert_close(ix.combine(x, q, D), top_q(c, q) @ D, **tol)


def test_screen_scores_few_facts():
    """On generic keys the screen leaves a handful of candidates per token, not every fact."""
    F, H, q = 4000, 64, 4
    A, x, D = data("gauss", F, H, torch.float32, seed=1)
    x = x[torch.arange(len(x)) != 5]                             # no all-zero token here
    ix = TopQIndex(A)
    ix.combine(x, q, D)
    assert not ix.dense
    assert q * len(x) <= ix.candidates <= 40 * len(x), ix.candidates / len(x)


def test_chunks_of_alike_tokens_score_their_union():
    """A chunk of near-identical tokens (as a sequence's masked positions are) shares its candidates:
    it is scored as one product over their union, a chunk of unrelated tokens pair by pair; exact."""
    F, H, q = 4000, 256, 4
    g = gen(6)
    A = torch.randn(F, H, generator=g)
    x = torch.randn(80, H, generator=g)                          # chunks: 32 unrelated, 32 alike, 16 alike
    x[32:] = x[32] + 0.02 * torch.randn(48, H, generator=g)
    ix = TopQIndex(A)
    idx, vals = ix.select(x, q)
    assert ix.union_chunks == 2 and ix.chunks == 3 and not ix.dense
    c = x @ A.T
    assert same_selection(idx, c, q)
    torch.testing.assert_close(vals, c.gather(1, idx), rtol=1e-5, atol=1e-5)
    pairs = TopQIndex(A, scoring="pairs")
    assert torch.equal(pairs.select(x, q)[0].sort(1).values, idx.sort(1).values)
    ix.dense = True                                              # a later call that scores every fact says so
    assert torch.equal(ix.select(x, q)[0].sort(1).values, idx.sort(1).values)
    assert ix.candidates == len(x) * F and ix.union_chunks == 0 and ix.chunks == 0
    with pytest.raises(ValueError, match="scoring must be"):
        TopQIndex(A, scoring="chunks")


def test_near_ties_fall_back_to_dense_scores_and_stay_exact():
    A, x, D = data("clusters", 3000, 16, torch.float64, seed=2)
    ix = TopQIndex(A)
    out = ix.combine(x, 3, D)
    assert ix.dense                                              # the bound cannot separate near-duplicates
    torch.testing.assert_close(out, top_q_combine(x @ A.T, 3, D), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ix.combine(x, 3, D), out, rtol=0, atol=0)   # later calls: dense, same


def test_the_screen_bound_holds():
    """|c_z - c^_z| <= b_j: the proven bound of the int8 scores, checked fact by fact."""
    F, H = 700, 40
    for kind in ("gauss", "norms", "outliers"):
        A, x, _ = data(kind, F, H, torch.float64, seed=3)
        ix = TopQIndex(A, block=16)
        B, nb = ix.block, ix.n_blocks
        sx = x.abs().amax(1, keepdim=True).clamp_min(1e-300) / INT8_MAX
        X = torch.round(x / sx)
        S = (X @ ix.Qt.double()).view(-1, nb, B)                 # the integer products, exactly
        c_hat = S * sx[:, :, None] * ix.scale[None, :, None]
        bound = ((x - X * sx).norm(dim=1)[:, None] * ix.norm + (X * sx).norm(dim=1)[:, None] * ix.err)
        real = ix.fact.view(nb, B) >= 0
        c = torch.zeros_like(c_hat)
        c[:, real] = (x @ A.T)[:, ix.fact.view(nb, B)[real]]
        slack = (c - c_hat).abs() - bound[:, :, None]
        assert float(slack[:, real].max()) <= 1e-12, kind
        assert float(bound.max() / (x.norm(dim=1).max() * A.norm(dim=1).max())) < 0.05  # and it is tight


def test_small_and_odd_shapes():
    g = gen(4)
    for F, H, N, q in ((5, 3, 1, 1), (40, 7, 3, 2), (100, 1, 4, 3), (70, 9, 2, 3)):
        A = torch.randn(F, H, generator=g, dtype=torch.float64)
        x = torch.randn(N, H, generator=g, dtype=torch.float64)
        D = torch.randn(F, H, generator=g, dtype=torch.float64)
        ix = TopQIndex(A, block=8)                               # F < q * block: the dense scores
        torch.testing.assert_close(ix.combine(x, q, D), top_q_combine(x @ A.T, q, D), rtol=1e-12, atol=1e-12)
    empty = TopQIndex(torch.randn(40, 4, dtype=torch.float64))
    none = torch.zeros(0, 4, dtype=torch.float64)
    assert empty.combine(none, 2, torch.zeros(40, 4, dtype=torch.float64)).shape == (0, 4)


def test_deterministic():
    A, x, D = data("gauss", 2000, 32, torch.float32, seed=5)
    a = TopQIndex(A).combine(x, 4, D)
    b = TopQIndex(A.clone()).combine(x.clone(), 4, D)
    assert torch.equal(a, b)
