"""ridge.RidgeMemory's two forms (facts: F x F, hidden: H x H) against a direct float64 solve."""

import pytest
import torch

from timerome import TimeromeError
from timerome.memory import ridge as ridge_mod
from timerome.memory.ridge import FACTS, HIDDEN, RidgeMemory

H = 16
LAM = 0.7


def gen(seed):
    return torch.Generator().manual_seed(seed)


def rows(n, seed, scale=1.0):
    g = gen(seed)
    U = torch.randn(n, H, generator=g, dtype=torch.float64) * scale
    return U, torch.randn(n, H, generator=g, dtype=torch.float64)


def metric(kind):
    """(mean, precision) of the paper metric (None) or of a random SPD background covariance."""
    if kind == "paper":
        return None, None
    g = gen(99)
    X = torch.randn(4 * H, H, generator=g, dtype=torch.float64)
    cov = X.T @ X / (4 * H) + 0.1 * torch.eye(H, dtype=torch.float64)
    return torch.randn(H, generator=g, dtype=torch.float64), torch.linalg.inv(cov)


def reference(U, D, mean, precision, lam=LAM):
    """The facts form written out: G = (K (U - mu)^T + lambda I)^-1, A = G K, W = A^T D."""
    Uc = U - (0 if mean is None else mean)
    K = Uc if precision is None else Uc @ precision
    G = torch.linalg.inv(K @ Uc.T + lam * torch.eye(len(U), dtype=torch.float64))
    A = G @ K
    return G, A, A.T @ D


def close(a, b, rtol=1e-9):
    err = float((a - b).abs().max() / b.abs().max())
    assert err < rtol, err


def assert_matches(r, U, D, mean, precision):
    G, A, W = reference(U, D, mean, precision)
    close(r.W, W)
    close(r.A, A)
    close(r.G, G)
    h = torch.randn(5, H, generator=gen(7), dtype=torch.float64)
    hc = h - (0 if mean is None else mean)
    close(hc @ r.A.T, hc @ A.T)                                   # the coefficients
    T, R = r.balanced()                                          # the index's coordinates
    close((hc if T is None else hc @ T) @ R.T, hc @ A.T)


def memory(kind, **kw):
    mean, precision = metric(kind)
    return RidgeMemory(H, mean=mean, precision=precision, lam_absolute=LAM, **kw), mean, precision


@pytest.mark.parametrize("kind", ["paper", "whitened"])
@pytest.mark.parametrize("F", [5, H, H + 1, 4 * H])
def test_batch_solve_in_the_smaller_form_equals_the_facts_form(kind, F):
    r, mean, precision = memory(kind)
    U, D = rows(F, seed=F, scale=2.0)
    r.insert(U, D)
    assert r.form == (HIDDEN if F > H else FACTS)
    assert_matches(r, U, D, mean, precision)


@pytest.mark.parametrize("kind", ["paper", "whitened"])
def test_streaming_inserts_and_removes_cross_both_forms(kind):
    r, mean, precision = memory(kind)
    U, D = rows(8 * H, seed=1, scale=2.0)
    held = []

    def insert(idx):
        r.insert(U[idx], D[idx])
        held.extend(idx)

    def remove(facts):
        pos = [held.index(f) for f in facts]
        keep = [j for j in range(len(held)) if j not in pos]
        r.delete(torch.tensor(keep), torch.tensor(sorted(pos)))
        held[:] = [held[j] for j in keep]

    steps = [
        (lambda: insert(list(range(0, 10))), FACTS),             # 10 <= H
        (lambda: insert(list(range(10, 20))), HIDDEN),           # 20 > H: switched, one solve
        *[(lambda i=i: insert([i]), HIDDEN) for i in range(20, 26)],   # Woodbury, k = 1
        (lambda: insert(list(range(26, 90))), HIDDEN),           # k = 64 > H: a solve pays more
        (lambda: remove([89]), HIDDEN),                          # the newest
        (lambda: remove([0, 33, 57]), HIDDEN),                   # from the front and the middle
        (lambda: remove([f for f in range(30, 80) if f in held]), HIDDEN),  # a big block: solved again
        (lambda: remove(held[:len(held) - H + 2]), HIDDEN),      # H - 2 left: still hidden (H / 2 < F <= H)
        (lambda: insert([90, 91, 92]), HIDDEN),
        (lambda: remove(held[:len(held) - H // 2]), FACTS),      # H / 2 left: back to the facts form
        (lambda: insert([93]), FACTS),
        (lambda: remove([93]), FACTS),
        (lambda: insert(list(range(94, 94 + H))), HIDDEN),
    ]
    for i, (step, form) in enumerate(steps):
        step()
        assert r.form == form, i
        assert r.n == len(held) == len(set(held)), i
        torch.testing.assert_close(r.U, U[held], atol=0, rtol=0)
        torch.testing.assert_close(r.D, D[held], atol=0, rtol=0)
        assert_matches(r, U[held], D[held], mean, precision)


def test_hidden_form_keeps_no_facts_by_facts_matrix():
    r, _, _ = memory("whitened")
    r.reserve(50 * H)                                            # room for many facts: U, D only
    assert r._G.shape[0] <= H
    U, D = rows(50 * H, seed=2)
    r.insert(U[:10], D[:10])
    r.insert(U[10:], D[10:])
    assert r.form == HIDDEN and r._G.numel() == 0 and r._A.numel() == 0 and r._K.numel() == 0
    big = [t for t in vars(r).values() if isinstance(t, torch.Tensor) and t.dim() == 2 and min(t.shape) > H]
    assert not big, [tuple(t.shape) for t in big]
    for _ in range(3):                                           # streaming keeps it so
        r.insert(*rows(1, seed=3))
    assert r._G.numel() == 0 and r.W.shape == (H, H)


def test_woodbury_equals_a_fresh_solve(monkeypatch):
    U, D = rows(5 * H, seed=4)
    streamed, _, _ = memory("whitened")
    streamed.insert(U[:2 * H], D[:2 * H])
    for i in range(2 * H, 5 * H, 3):                             # rank-3 updates
        streamed.insert(U[i:i + 3], D[i:i + 3])
    monkeypatch.setattr(ridge_mod, "_woodbury_pays", lambda k, n, H: False)  # every update a solve
    solved, _, _ = memory("whitened")
    solved.insert(U[:2 * H], D[:2 * H])
    for i in range(2 * H, 5 * H, 3):
        solved.insert(U[i:i + 3], D[i:i + 3])
    close(streamed.W, solved.W, 1e-10)
    close(streamed.A, solved.A, 1e-10)


def test_a_downdate_that_fails_solves_again(monkeypatch):
    r, mean, precision = memory("paper")
    U, D = rows(4 * H, seed=5)
    r.insert(U, D)

    def singular(*a, **k):
        raise TimeromeError("the ridge system is singular")

    monkeypatch.setattr(RidgeMemory, "_woodbury", singular)
    keep = torch.arange(1, 4 * H)
    r.delete(keep, torch.tensor([0]))
    assert r.form == HIDDEN
    assert_matches(r, U[1:], D[1:], mean, precision)


def test_lambda_zero_stays_in_the_facts_form():
    r = RidgeMemory(H, lam_absolute=0.0)
    U, D = rows(H, seed=6)
    r.insert(U, D)                                               # H independent keys: solvable
    assert r.form == FACTS
    G, A, W = reference(U, D, None, None, lam=0.0)
    close(r.W, W, 1e-7)
    with pytest.raises(TimeromeError, match="singular"):
        r.insert(*rows(1, seed=7))                               # H + 1 keys in H dimensions
    assert r.n == H and r.form == FACTS


def test_restore_without_g_solves_the_smaller_form():
    for F in (H // 2, 3 * H):
        U, D = rows(F, seed=8)
        a, mean, precision = memory("whitened", key_scale=1.0)
        a.insert(U, D)
        b, _, _ = memory("whitened", key_scale=1.0)
        b.restore(U, D)
        assert b.form == a.form == (HIDDEN if F > H else FACTS)
        close(b.W, a.W, 1e-10)
        assert_matches(b, U, D, mean, precision)


def test_version_only_grows():
    r, _, _ = memory("paper")
    seen = [r.version]
    for step in (lambda: r.insert(*rows(3, seed=9)), r.reset, lambda: r.insert(*rows(2, seed=10))):
        step()
        seen.append(r.version)
    assert seen == sorted(set(seen)), seen   # a cache keyed by version never sees an old number again


def test_lambda_over_the_keys_is_the_relative_lambda_on_the_first_keys():
    """lam_over_keys (what `timerome edit` warns on): the relative lambda where the key scale is the stored keys'
    own (the first insert's), lam_absolute over their mean squared norm otherwise."""
    g = torch.Generator().manual_seed(4)
    U, D = torch.randn(6, 8, generator=g, dtype=torch.float64) * 3, torch.randn(6, 8, generator=g, dtype=torch.float64)
    rel = RidgeMemory(8, lam=5.0)
    rel.insert(U, D)
    assert rel.lam_over_keys() == pytest.approx(5.0, rel=1e-12)
    rel.insert(U[:2] * 10, D[:2])  # a later insert leaves the scale fixed: the ratio follows the keys held
    assert rel.lam_over_keys() == pytest.approx(5.0 * rel.key_scale / rel.scale_of(rel.U), rel=1e-12)
    assert rel.lam_over_keys() < 5.0
    ab = RidgeMemory(8, lam_absolute=2.0)
    ab.insert(U, D)
    assert ab.lam_over_keys() == pytest.approx(2.0 / float((U * U).sum(1).mean()), rel=1e-12)
