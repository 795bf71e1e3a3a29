"""Locate-then-edit baselines (rome, memit, alphaedit, unke) on the embedded model.

Each method is installed once with its defaults (module-scoped), then checked for: forget LP
down by a clear margin and clearly more than retain LP, exact undo, diagnostics. The closed
forms and the cached key statistic are checked directly.
"""

from __future__ import annotations

import time

import pytest
import torch
from conftest import mean_answer_lp

import timerome
from timerome.data.rows import spread
from timerome.errors import TimeromeError
from timerome.methods import _locate as L
from timerome.methods import available, get_method, install

METHODS = ("rome", "memit", "alphaedit", "unke")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    # the key statistic is written here, not into the user's ~/.cache
    with pytest.MonkeyPatch.context() as mp:
        d = tmp_path_factory.mktemp("timerome-cache")
        mp.setenv("TIMEROME_CACHE", str(d))
        yield d


@pytest.fixture(scope="module")
def bb(cache):
    return timerome.load_backbone()


@pytest.fixture(scope="module")
def rows(task):
    return {"forget": spread(task.forget_rows, 6), "retain": spread(task.retain_rows, 8)}


def _probe_logits(bb, rows):
    ids = torch.tensor([bb.encode(rows["forget"][0]["question"] + " " + rows["forget"][0]["answer"])])
    with torch.no_grad():
        return bb.logits(ids)


@pytest.fixture(scope="module")
def base(bb, rows):
    return {"forget": mean_answer_lp(bb, rows["forget"]), "retain": mean_answer_lp(bb, rows["retain"]), "logits": _probe_logits(bb, rows)}


@pytest.fixture(scope="module", params=METHODS)
def outcome(request, bb, task, rows, base):
    """Install one method (defaults, seed 0), score it, undo it."""
    edit = install(request.param, bb, task, seed=0)
    out = {"method": request.param, "edit": edit, "forget": mean_answer_lp(bb, rows["forget"]),
           "retain": mean_answer_lp(bb, rows["retain"]), "edited_logits": _probe_logits(bb, rows)}
    edit.undo()
    out["undone_logits"] = _probe_logits(bb, rows)
    return out


# ------------------------------------------------------------------------------ registry


def test_registered_as_weight_methods():
    names = available()
    for m in METHODS:
        assert m in names
        meth = get_method(m)
        assert meth.kind == "weights"
        assert meth.canonical == ({},)  # one canonical row: the defaults


# ------------------------------------------------------------------------------ each method


def test_forget_lp_drops_clearly_and_more_than_retain(outcome, base):
    d_forget = outcome["forget"] - base["forget"]
    d_retain = outcome["retain"] - base["retain"]
    assert d_forget < -2.0, f"{outcome['method']}: forget LP moved only {d_forget:.2f} nats"
    assert d_forget < d_retain - 1.5, f"{outcome['method']}: forget {d_forget:.2f} vs retain {d_retain:.2f}"


def test_undo_restores_logits_exactly(outcome, base):
    assert not torch.equal(outcome["edited_logits"], base["logits"])  # the edit did change the model
    assert torch.equal(outcome["undone_logits"], base["logits"])


def test_install_reports_cost_and_diagnostics(outcome, task):
    edit, info = outcome["edit"], outcome["edit"].info
    assert 0 < edit.install_seconds < 60
    m = outcome["method"]
    if m == "rome":  # one rank-one update per fact, each with its own optimised delta
        assert len(info["delta_norm"]) == len(task.facts) and all(x > 0 for x in info["delta_norm"])
    elif m in ("memit", "alphaedit"):
        assert len(info["update_norms"]) == len(info["layers"]) >= 1
        assert info["residual_left"] < info["delta"]["delta_norm"]  # the updates moved toward z
    if m == "alphaedit":  # the null-space projector is never all zero
        assert len(info["null_rank"]) == len(info["layers"])
        assert all(r > 0 for r in info["null_rank"]) and all(0 < e < 1 for e in info["null_energy"])
    if m == "unke":  # the block was fitted toward its target outputs
        assert info["fit_loss"][1] < 0.7 * info["fit_loss"][0]


def test_same_seed_same_edit(bb, task):
    def edited():
        edit = install("memit", bb, task, seed=3)
        w = [L.down_projection(bb, l).linear.weight.detach().clone() for l in edit.info["layers"]]
        edit.undo()
        return w

    a, b = edited(), edited()
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# ------------------------------------------------------------------------------ where and what


def test_down_projection_is_the_mlp_output(bb):
    proj = L.down_projection(bb, 1)
    assert isinstance(proj.linear, torch.nn.Linear)
    assert proj.linear.out_features == bb.hidden_size
    assert proj.path == bb.module_path(1, "mlp")


def test_down_projection_inside_an_mlp_module(tmp_path):
    from timerome.backbones.tiny import make_tiny_checkpoint

    llama = timerome.load_backbone(make_tiny_checkpoint("diffullama", tmp_path / "llama"))
    proj = L.down_projection(llama, 0)
    assert proj.path == "model.layers.0.mlp.down_proj"
    moe = timerome.load_backbone(make_tiny_checkpoint("llada-moe", tmp_path / "moe"))
    with pytest.raises(TimeromeError, match="down projection"):
        L.down_projection(moe, 0)


def test_key_stats_are_cached_and_reused(bb, task, cache, monkeypatch):
    texts = spread(L.preserved_texts(bb, task), 300)
    assert not set(texts) & {f"{r['question']} {r['answer']}" for r in task.forget_rows}
    C, path = L.key_stats(bb, 2, texts)
    assert path.is_file() and cache in path.parents
    d = L.down_projection(bb, 2).linear.in_features
    assert C.shape == (d, d) and C.dtype == torch.float64
    assert torch.allclose(C, C.T) and float(torch.linalg.eigvalsh(C).min()) > -1e-8

    # several layers in one pass: the same C as the layer alone
    both = L.key_stats_layers(bb, [1, 2], texts, cache=False)
    torch.testing.assert_close(both[2][0], C, atol=1e-9, rtol=1e-9)
    assert both[1][0].shape == (L.down_projection(bb, 1).linear.in_features,) * 2

    def fail(*_a, **_k):
        raise AssertionError("recomputed instead of read from the cache")

    monkeypatch.setattr(L, "_second_moments", fail)
    again, path2 = L.key_stats(bb, 2, texts)
    assert path2 == path and torch.equal(again, C)
    with pytest.raises(AssertionError, match="recomputed"):  # another layer is another file
        L.key_stats(bb, 3, texts)


def test_key_stats_wait_for_a_process_making_them_and_read_what_it_made(bb, task, cache, monkeypatch):
    """While another holder (a thread here: it locks the file as another process would) makes a layer's
    statistics, key_stats says that it waits, then reads what the holder wrote instead of measuring
    them again; no lock file is left."""
    import threading

    from timerome.common import lock
    from timerome.common.cache import entry_lock, save_tensors

    texts = spread(L.preserved_texts(bb, task), 50)
    path = L.stats_cache_path(bb, 1, texts)
    said, held = [], threading.Event()
    monkeypatch.setattr(lock, "notify", said.append)

    def holder():
        with entry_lock(path, "the key statistics of layer 1"):
            held.set()
            t0 = time.monotonic()
            while not said and time.monotonic() - t0 < 60:  # until the other one waits
                time.sleep(0.02)
            save_tensors(path, {"C": torch.eye(3, dtype=torch.float64)})

    t = threading.Thread(target=holder)
    t.start()
    held.wait(60)
    monkeypatch.setattr(L, "_second_moments", lambda *a, **k: pytest.fail("measured instead of read"))
    C, got = L.key_stats(bb, 1, texts)
    t.join()
    assert got == path and torch.equal(C, torch.eye(3, dtype=torch.float64))
    assert len(said) == 1 and "the key statistics of layer 1 is in use by" in said[0]
    assert not list(cache.rglob("*.lock"))


# ------------------------------------------------------------------------------ closed forms


def _spd(d, g):
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    return A @ A.T / d + 0.1 * torch.eye(d, dtype=torch.float64)


def test_rome_update_writes_r_at_k_only():
    g = torch.Generator().manual_seed(0)
    d, H = 12, 5
    C = _spd(d, g)
    C_inv = torch.linalg.inv(C)
    k, r = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(H, generator=g, dtype=torch.float64)
    dW = L.rome_update(C_inv, k, r)
    assert torch.allclose(dW @ k, r)
    other = torch.randn(d, generator=g, dtype=torch.float64)
    other -= (other @ C_inv @ k) / (k @ C_inv @ k) * k       # C^-1-orthogonal to k
    assert torch.allclose(dW @ other, torch.zeros(H, dtype=torch.float64), atol=1e-10)
    assert torch.linalg.matrix_rank(dW) == 1


def test_memit_update_is_the_least_squares_solution():
    g = torch.Generator().manual_seed(1)
    d, H, F = 10, 4, 3
    C, K = _spd(d, g), torch.randn(F, d, generator=g, dtype=torch.float64)
    R = torch.randn(F, H, generator=g, dtype=torch.float64)
    dW = L.memit_update(K, R, C, weight=2.0)
    # normal equations of |dW K^T - R^T|^2 + w tr(dW C dW^T), w = 2
    assert torch.allclose(dW @ (2.0 * C + K.T @ K), R.T @ K)


def test_null_projector_relative_threshold_and_alphaedit_span():
    g = torch.Generator().manual_seed(2)
    d = 16
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    evals = torch.logspace(-6, 2, d, dtype=torch.float64)       # scale-free: 1e-6 .. 1e2
    C = Q @ torch.diag(evals) @ Q.T
    P, info = L.null_projector(C, rel_threshold=1e-2)
    assert info["null_rank"] == int((evals < 1e-2 * 1e2).sum()) and 0 < info["null_rank"] < d
    assert torch.allclose(P @ P, P, atol=1e-10)
    P100, _ = L.null_projector(100 * C, rel_threshold=1e-2)      # the same directions at any scale
    assert torch.allclose(P100, P, atol=1e-8)
    P0, info0 = L.null_projector(C, rel_threshold=0.0)           # nothing qualifies: still one direction
    assert info0["null_rank"] == 1 and float(P0.norm()) > 0.5
    _, infoE = L.null_projector(C, energy=1e-3)
    assert 0 < infoE["null_rank"] < d and infoE["null_energy"] <= 1e-3
    K, R = torch.randn(3, d, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)
    dW = L.alphaedit_update(K, R, P, l2=0.1)
    assert float(dW.norm()) > 0
    assert torch.allclose(dW @ (torch.eye(d, dtype=torch.float64) - P), torch.zeros(5, d, dtype=torch.float64),
                          atol=1e-9)                            # preserved span untouched


@pytest.mark.parametrize("method, over", [
    ("rome", {"grad_steps": 0}), ("memit", {"layers": []}), ("memit", {"layers": [0, "x"]}), ("ga", {"batch_size": 0}),
    ("ga", {"lr": "fast"}), ("ga", {"safe": "yes"}), ("timerome", {"trace_facts": 0}), ("npo", {"steps": 2.5}),
])
def test_bad_options_are_refused_by_name(method, over):
    from timerome.methods import method_config

    with pytest.raises(TimeromeError, match=next(iter(over))):
        method_config(method, over)


@pytest.mark.parametrize("method, over", [("unke", {"layer": 99}), ("memit", {"layers": [0, 9]}),
                                          ("rome", {"layer": -9})])
def test_layers_outside_the_model_are_refused(bb, task, method, over):
    with pytest.raises(TimeromeError, match="out of range"):
        install(method, bb, task, over, seed=0)


def test_a_long_install_shows_its_progress_only_where_asked(bb, task, capsys, monkeypatch, tmp_path):
    """MEMIT's v* optimisation and key statistics ran 143 s on SmolLM2 with nothing shown under `timerome
    edit` (review 67). install(progress=True) shows their bars (plain lines off a terminal); a script's
    install (progress off, the default) stays quiet."""
    monkeypatch.setenv("TIMEROME_PROGRESS_SECONDS", "0")  # every step a line
    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path))  # key statistics made here, not read from a cache
    config = {"grad_steps": 3, "stats_samples": 20}
    install("memit", bb, task, config, seed=0).undo()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "again"))
    install("memit", bb, task, config, seed=0, progress=True).undo()
    err = capsys.readouterr().err
    assert "target values v* of" in err and "3/3 (100%)" in err, err
    assert "key statistics of layers" in err, err
    install("ga", bb, task, {"grad_steps": 2}, seed=0, progress=True).undo()
    assert "ga: gradient steps: 2/2" in capsys.readouterr().err
