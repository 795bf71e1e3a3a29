"""Every family against its official modelling code, through the golden fixtures.

`../shared/fixtures/backbones/<family>/` holds a tiny checkpoint laid out as the release and the
official fp32 outputs (logits, embedding, per-layer block / attention / MLP outputs, a padded case).
`load_backbone(checkpoint)` without remote code must reproduce them within 1e-5. These are core
tests: without the fixtures they fail and say where they looked.
"""

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES
from safetensors.torch import load_file
from typer.testing import CliRunner

from timerome import TimeromeError, load_backbone
from timerome.backbones import golden
from timerome.backbones.flags import RefusedConfig, TimeromeConfigWarning
from timerome.engine.hooks import capture, edit

TOL = 1e-5


def paths(case: str) -> tuple[Path, Path]:
    ckpt, g = golden.paths(FIXTURES, case)
    if not g.exists():
        looked = ", ".join(str(r) for r in golden.search_roots(Path(__file__).resolve().parents[2]))
        pytest.fail(f"golden fixture {g} not found: looked in {looked} (CI keeps ../shared beside the clone)")
    return ckpt, g


_LOADED = {}


def loaded(case: str, dtype: str = "float32"):
    if (case, dtype) not in _LOADED:
        ckpt, g = paths(case)
        _LOADED[(case, dtype)] = (load_backbone(ckpt, dtype=dtype), load_file(str(g)))
    return _LOADED[(case, dtype)]


def _copy(case: str, tmp_path: Path, **config_changes) -> Path:
    ckpt, _ = paths(case)
    d = shutil.copytree(ckpt, tmp_path / case)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in config_changes.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


_DROP = object()


# ------------------------------------------------------------------------------ golden conformance


@pytest.mark.parametrize("case", list(golden.CASES))
def test_logits_and_hooks_match_the_official_code(case):
    bb, g = loaded(case)
    assert bb.family.name == golden.CASES[case].family and not bb.remote
    layers = sorted({int(k.split(".")[1]) for k in g if k.startswith("layers.")})
    assert layers == list(range(bb.n_layers))
    points = sorted({k.split(".")[2] for k in g if k.startswith("layers.")})
    assert {"resid", "attn", "mlp"} <= set(points) and set(points) <= set(bb.points)
    sites = [(None, "embed")] + [(layer, p) for layer in layers for p in points]
    cases = [("", None)] + ([("pad.", g["pad.attention_mask"])] if "pad.input_ids" in g else [])
    for pre, am in cases:
        keep = am.bool() if am is not None else torch.ones(g["input_ids"].shape, dtype=torch.bool)
        with torch.no_grad(), capture(bb, sites) as st:
            logits = bb.logits(g[pre + "input_ids"], attention_mask=am)
        worst = (logits - g[pre + "logits"])[keep].abs().max().item()
        assert worst <= TOL, f"{case} {pre or 'plain '}logits differ by {worst:.2e}"
        for layer, p in sites:
            name = pre + ("embed" if layer is None else f"layers.{layer}.{p}")
            assert len(st[(layer, p)]) == 1, name
            worst = (st[(layer, p)][0] - g[name])[keep].abs().max().item()
            assert worst <= TOL, f"{case}: {name} differs by {worst:.2e}"


@pytest.mark.parametrize("case", list(golden.CASES))
def test_readout_of_the_last_block_output_gives_the_official_logits(case):
    """Backbone.readout (final norm + head, from the family table) on the golden last-block output
    reproduces the official logits (unshifted: a logit_shift family's output j predicts token j + 1)."""
    bb, g = loaded(case)
    with torch.no_grad():
        got = bb.readout(g[f"layers.{bb.n_layers - 1}.resid"])
    want = g["logits"]
    if bb.family.logit_shift:
        got, want = got[:, :-1], want[:, 1:]
    worst = (got - want).abs().max().item()
    assert worst <= TOL, f"{case}: read-out differs from the logits by {worst:.2e}"


def test_readout_is_tied_to_the_embedding_without_a_head(tmp_path):
    from safetensors.torch import save_file

    tied = _copy("llada", tmp_path, weight_tying=True)
    st = load_file(str(tied / "model.safetensors"))
    st.pop("model.transformer.ff_out.weight")
    save_file(st, str(tied / "model.safetensors"))
    bb = load_backbone(tied)
    ids = torch.tensor([[3, 5, 7, 11]])
    with torch.no_grad(), capture(bb, [(bb.n_layers - 1, "resid")]) as st:
        logits = bb.logits(ids)
        got = bb.readout(st[(bb.n_layers - 1, "resid")][0])
    assert "model.transformer.ff_out" not in dict(bb.model.named_modules())
    assert torch.allclose(got, logits, atol=1e-5)


def test_moe_mlp_point_is_routed_plus_shared():
    bb, g = loaded("llada-moe-shared")
    assert bb.module_path(0, "mlp") == "model.layers.0.mlp_sum"
    assert bb.module_path(0, "mlp_routed") == "model.layers.0.mlp"
    assert bb.module_path(0, "mlp_shared") == "model.layers.0.shared_expert"  # a sibling of mlp, as released
    assert not list(bb.module(0, "mlp").parameters())  # our only extra module holds no weights
    with torch.no_grad(), capture(bb, [(1, "mlp"), (1, "mlp_routed"), (1, "mlp_shared")]) as st:
        bb.logits(g["input_ids"])
    torch.testing.assert_close(st[(1, "mlp")][0], st[(1, "mlp_routed")][0] + st[(1, "mlp_shared")][0])
    release, _ = loaded("llada-moe")
    assert "mlp_shared" not in release.points  # the release has no shared expert


@pytest.mark.parametrize("case", list(golden.CASES))
def test_bf16_stays_within_the_official_bf16_rounding(case):
    bb32, g = loaded(case)
    bb16, _ = loaded(case, "bfloat16")
    assert bb16.dtype == torch.bfloat16
    with torch.no_grad():
        diff = (bb16.logits(g["input_ids"]).float() - bb32.logits(g["input_ids"])).abs().max().item()
    assert diff <= golden.OFFICIAL_BF16_VS_FP32[case], (case, diff)


# ------------------------------------------------------------------------------ detection


@pytest.mark.parametrize("case", list(golden.CASES))
def test_detected_from_keys_and_architectures(case):
    bb, _ = loaded(case)
    arch = json.loads((paths(case)[0] / "config.json").read_text())["architectures"]
    assert any(str(arch) in e for e in bb.info["evidence"]), bb.info["evidence"]
    assert "transformers" in bb.info["implementation"] or "timerome" in bb.info["implementation"]


def test_llada_moe_is_not_taken_for_llada_although_its_model_type_says_llada():
    ckpt, _ = paths("llada-moe")
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "llada"
    assert loaded("llada-moe")[0].family.name == "llada-moe"


def test_a_wrong_family_is_a_clear_error():
    with pytest.raises(TimeromeError, match=r"family='llada' does not fit.*d_model.*looks like llada-moe.*LLaDAMoEModelLM"):
        load_backbone(paths("llada-moe")[0], family="llada")
    with pytest.raises(TimeromeError, match=r"family='diffullama' does not match.*looks like dream.*DreamModel"):
        load_backbone(paths("dream")[0], family="diffullama")
    with pytest.raises(TimeromeError, match=r"family='llada-moe' does not fit.*looks like mmada"):
        load_backbone(paths("mmada")[0], family="llada-moe")
    assert load_backbone(paths("llada")[0], family="llada").family.name == "llada"  # a right one is fine


# ------------------------------------------------------------------------------ tokenizers


@pytest.mark.parametrize("case", [c for c in golden.CASES if c != "llada-moe-shared"])
def test_tokenizer_loads_without_remote_code_with_the_release_special_tokens(case):
    bb, g = loaded(case)
    tok = bb.tokenizer
    meta = _metadata(paths(case)[1])
    assert bb.mask_id == int(meta["mask_token_id"])
    pad = bb.config.get("pad_token_id", tok.pad_token_id)
    if meta.get("pad_token_id") not in (None, "None") and case != "diffullama":  # DiffuLLaMA pads with 0 by hand
        assert pad == int(meta["pad_token_id"])
    for row, text in enumerate(("The capital of France is Paris,", "Harry Potter studied magic at Hogwarts")):
        ids = tok(text)["input_ids"][:16]
        gold = g["input_ids"][row, : len(ids)].tolist()
        assert [a for a, b in zip(ids, gold) if b != bb.mask_id] == [b for b in gold if b != bb.mask_id]


def test_dream_tokenizer_is_qwen2_instead_of_the_remote_class():
    bb, _ = loaded("dream")
    assert type(bb.tokenizer).__name__ == "Qwen2Tokenizer"
    assert "instead of the remote tokenization_dream.DreamTokenizer" in bb.info["tokenizer"]["how"]
    tok = bb.tokenizer
    assert (tok.mask_token, tok.mask_token_id, tok.eos_token_id, tok.pad_token_id) == ("<|mask|>", 292, 288, 288)


def _metadata(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return dict(f.metadata())


# ------------------------------------------------------------------------------ config flags


def test_refused_flags_are_one_clear_line(tmp_path):
    for case, change, what in (("llada", {"block_type": "sequential"}, "block_type='sequential'"),
                               ("llada", {"alibi": True}, "alibi=True"),
                               ("llada", {"rope": _DROP}, "rope=absent, official default False"),
                               ("mmada", {"layer_norm_type": "default"}, "layer_norm_type='default'"),
                               ("llada-moe", {"norm_topk_prob": True}, "norm_topk_prob=True"),
                               ("llada-moe", {"moe_router_score_function": "sigmoid"}, "moe_router_score_function"),
                               ("dream", {"use_sliding_window": True}, "use_sliding_window=True")):
        d = _copy(case, tmp_path / what.split("=")[0], **change)
        with pytest.raises(RefusedConfig) as e:
            load_backbone(d)
        assert what in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_unknown_keys_are_listed_in_one_warning(tmp_path):
    d = _copy("llada-moe", tmp_path, frobnicate=True, zorb_factor=2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        bb = load_backbone(d)
    ours = [x for x in w if issubclass(x.category, TimeromeConfigWarning)]
    assert len(ours) == 1 and "frobnicate, zorb_factor" in str(ours[0].message)
    assert bb.info["config_keys"]["unknown"] == ["frobnicate", "zorb_factor"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TimeromeConfigWarning)
        for case in golden.CASES:  # the releases' own keys are all known
            load_backbone(paths(case)[0])


def test_input_emb_norm_scales_the_embedding(tmp_path):
    off, g = loaded("llada")
    on = load_backbone(_copy("llada", tmp_path, input_emb_norm=True))
    ids = g["input_ids"]
    with torch.no_grad(), edit(off, (None, "embed"), lambda h: h * (off.hidden_size ** 0.5)):
        want = off.logits(ids)
    with torch.no_grad():
        got = on.logits(ids)
        assert (got - off.logits(ids)).abs().max() > 0.1  # the flag matters on this fixture
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def test_scale_logits_divides_by_sqrt_d_model(tmp_path):
    off, g = loaded("mmada")
    on = load_backbone(_copy("mmada", tmp_path, scale_logits=True))
    with torch.no_grad():
        torch.testing.assert_close(on.logits(g["input_ids"]), off.logits(g["input_ids"]) / off.hidden_size ** 0.5,
                                   atol=TOL, rtol=1e-5)


def test_readout_divides_by_sqrt_d_model_where_the_config_scales_the_logits(tmp_path):
    on = load_backbone(_copy("mmada", tmp_path, scale_logits=True))
    _, g = loaded("mmada")
    with torch.no_grad(), capture(on, [(on.n_layers - 1, "resid")]) as st:
        logits = on.logits(g["input_ids"])
        got = on.readout(st[(on.n_layers - 1, "resid")][0])
    torch.testing.assert_close(got, logits, atol=TOL, rtol=1e-5)


def test_weight_tying_uses_the_embedding_as_head(tmp_path):
    from safetensors.torch import save_file

    _, g = loaded("llada")
    tied = _copy("llada", tmp_path / "tied", weight_tying=True)
    untied = _copy("llada", tmp_path / "untied")
    st = load_file(str(tied / "model.safetensors"))
    head = st.pop("model.transformer.ff_out.weight")
    save_file(st, str(tied / "model.safetensors"))
    st["model.transformer.ff_out.weight"] = st["model.transformer.wte.weight"].clone()
    save_file(st, str(untied / "model.safetensors"))
    assert head.shape == st["model.transformer.wte.weight"].shape
    with torch.no_grad():
        a = load_backbone(tied).logits(g["input_ids"])
        b = load_backbone(untied).logits(g["input_ids"])
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------ timerome info


def _info(*args):
    from timerome.cli import app

    res = CliRunner().invoke(app, ["info", *[str(a) for a in args]])
    return res.exit_code, res.output


@pytest.mark.parametrize("case", list(golden.CASES))
def test_info_describes_each_release(case):
    ckpt, g = paths(case)
    code, out = _info("-m", ckpt, "--json")
    assert code == 0, out
    d = json.loads(out)
    bb, _ = loaded(case)
    assert d["family"] == golden.CASES[case].family and d["evidence"] and d["dtype"] == "float32"
    assert d["special_ids"]["mask"]["id"] == bb.mask_id
    assert {"eos", "pad"} <= set(d["special_ids"]) and d["tokenizer"]["class"]
    assert set(d["hook_points"]) == set(bb.points) and d["config_keys"]["refused"] == []
    code, out = _info(ckpt)  # the directory as an argument, as --model
    assert code == 0 and d["family"] in out and "detected from" in out and "refused config flags" in out, out


def test_info_lists_refused_flags(tmp_path):
    d = _copy("llada", tmp_path, alibi=True)
    code, out = _info("-m", d)
    assert code == 2 and "refused" in out and "alibi=True" in out and "Traceback" not in out, out
    code, out = _info("-m", d, "--json")
    rep = json.loads(out)
    assert code == 2 and rep["family"] == "llada" and rep["loaded"] is False and "alibi=True" in rep["refused"][0]
