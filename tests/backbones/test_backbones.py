import json
import shutil

import pytest
import torch

from timerome import TimeromeError, load_backbone
from timerome.backbones.families import FAMILIES, get_family
from timerome.backbones.loading import _mask_id
from timerome.backbones.tiny import make_tiny_checkpoint
from timerome.engine.hooks import Intervention, capture, patch
from timerome.engine.likelihood import masked_head_applies
from timerome.tracing.causal_trace import trace
from timerome.tracing.wavefront import rows_can_assemble, rows_can_join, rows_can_pack

FAMILY_NAMES = ["timerome", "llada", "mmada", "llada-moe", "dream", "diffullama"]


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {f: make_tiny_checkpoint(f, root / f, layers=3) for f in FAMILY_NAMES}


@pytest.fixture(scope="module")
def backbones(tiny_dirs):
    return {f: load_backbone(d) for f, d in tiny_dirs.items()}


def _ids(bb, n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, bb.vocab_size, (2, n), generator=g)
    ids[:, 3] = bb.mask_id
    return ids


@pytest.mark.parametrize("fam", FAMILY_NAMES)
def test_autodetects_family(backbones, fam):
    assert backbones[fam].family.name == fam
    assert backbones[fam].n_layers == 3


@pytest.mark.parametrize("fam", FAMILY_NAMES)
def test_block_out_is_block_in_plus_attn_plus_mlp(backbones, fam):
    bb = backbones[fam]
    ids = _ids(bb)
    sites = [(None, "embed")] + [(l, p) for l in range(bb.n_layers) for p in ("resid", "attn", "mlp")]
    with torch.no_grad(), capture(bb, sites) as store:
        bb.logits(ids)
    for l in range(bb.n_layers):
        block_in = store[(None, "embed")][0] if l == 0 else store[(l - 1, "resid")][0]
        recon = block_in + store[(l, "attn")][0] + store[(l, "mlp")][0]
        torch.testing.assert_close(store[(l, "resid")][0], recon, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fam", FAMILY_NAMES)
def test_patching_own_activation_is_bit_identical(backbones, fam):
    bb = backbones[fam]
    ids = _ids(bb)
    pos = torch.tensor([1, 2, 5])
    with torch.no_grad():
        clean = bb.logits(ids)
        for point in ("resid", "attn", "mlp"):
            site = (1, point)
            with capture(bb, [site], positions=pos) as store:
                bb.logits(ids)
            with patch(bb, {site: store[site][0]}, pos):
                patched = bb.logits(ids)
            assert torch.equal(clean, patched), point


@pytest.mark.parametrize("fam", FAMILY_NAMES)
def test_each_hook_fires_once_per_forward(backbones, fam):
    bb = backbones[fam]
    counts = {}

    def counter(site):
        def fn(h, state):
            counts[site] = counts.get(site, 0) + 1
        return fn

    sites = [(l, p) for l in range(bb.n_layers) for p in ("resid", "attn", "mlp")] + [(None, "embed")]
    with torch.no_grad(), Intervention(bb, {s: counter(s) for s in sites}):
        bb.logits(_ids(bb))
        bb.logits(_ids(bb, seed=1))
    assert counts == {s: 2 for s in sites}
    # and removed afterwards
    with torch.no_grad():
        bb.logits(_ids(bb))
    assert counts == {s: 2 for s in sites}


@pytest.mark.parametrize("fam", FAMILY_NAMES)
def test_head_is_never_a_block_module(backbones, fam):
    bb = backbones[fam]
    head = bb.model.get_output_embeddings() if hasattr(bb.model, "get_output_embeddings") else None
    heads = {id(m) for n, m in bb.model.named_modules() if n in ("lm_head", "model.transformer.ff_out")}
    if head is not None:
        heads.add(id(head))
    assert heads
    for l in range(bb.n_layers):
        for p in ("resid", "attn", "mlp"):
            assert id(bb.module(l, p)) not in heads


@pytest.mark.parametrize("fam", FAMILY_NAMES)
def test_logits_aligned_and_bidirectional(backbones, fam):
    bb = backbones[fam]
    ids = _ids(bb)
    with torch.no_grad():
        out = bb.logits(ids)
        raw = bb.model(input_ids=ids, **bb.forward_kwargs(ids, None)).logits
        if bb.family.logit_shift:
            torch.testing.assert_close(out[:, 1:], raw[:, :-1])
        else:
            torch.testing.assert_close(out, raw)
        ids2 = ids.clone()
        ids2[:, -1] = (ids2[:, -1] + 1 - 5) % (bb.vocab_size - 5) + 5
        assert not torch.allclose(bb.logits(ids2)[:, 1], out[:, 1])  # a later token reaches position 1


@pytest.mark.parametrize("fam", FAMILY_NAMES)
def test_padding_is_invisible(backbones, fam):
    bb = backbones[fam]
    ids = _ids(bb)[:1]
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    att = torch.cat([torch.ones(1, ids.shape[1]), torch.zeros(1, 4)], dim=1).bool()
    with torch.no_grad():
        a = bb.logits(ids)
        b = bb.logits(padded, att)[:, : ids.shape[1]]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fam", FAMILY_NAMES)
def test_left_padding_is_invisible(backbones, fam):
    # RoPE is relative, so only rounding tells positions 0..L-1 from positions counted over real
    # tokens; with a logit shift the first real token's logits come from a pad slot (a placeholder)
    bb = backbones[fam]
    ids = _ids(bb)[:1]
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
    att = torch.cat([torch.zeros(1, 4), torch.ones(1, ids.shape[1])], dim=1).bool()
    with torch.no_grad():
        a = bb.logits(ids)
        b = bb.logits(padded, att)[:, 4:]
    s = bb.family.logit_shift
    tol = 1e-5 if bb.family.positions == "from_mask" else 1e-4
    torch.testing.assert_close(a[:, s:], b[:, s:], atol=tol, rtol=tol)


@pytest.mark.parametrize("fam", FAMILY_NAMES)
def test_trace_rows_join_at_their_layer_in_every_family(backbones, fam):
    """The trace engine appends splicing rows to the batch between blocks, computes attn / mlp
    splices' own layer in packed rows and runs the head at the positions read: every family's
    blocks take the grown batch (`rows_can_join`), act on each position alone after their
    attention (`rows_can_pack`), sum (input + attention) + MLP in that order (`rows_can_assemble`),
    and give the TIE of the computation without any of it."""
    bb = backbones[fam]
    assert rows_can_join(bb) and rows_can_pack(bb) and rows_can_assemble(bb) and masked_head_applies(bb)
    facts = [dict(subject="the author", prompt="where was the author born ?", object="city of books")]
    on = trace(bb, facts, steps=3, n_samples=2, progress=False)
    off = trace(bb, facts, steps=3, n_samples=2, progress=False, reuse_layers=False, head="full")
    torch.testing.assert_close(on.tie_full, off.tie_full, atol=1e-5, rtol=1e-4, equal_nan=True)
    assert torch.equal(on.clean_logp, off.clean_logp)
    assert on.stats["block_rows"] < off.stats["block_rows"]


def test_bad_inputs(backbones, tiny_dirs, tmp_path):
    bb = backbones["timerome"]
    with pytest.raises(TimeromeError, match="unknown backbone family"):
        get_family("gpt9")
    with pytest.raises(TimeromeError, match="unknown backbone family"):
        load_backbone(tiny_dirs["timerome"], family="gpt9")
    with pytest.raises(TimeromeError, match="unknown hook point"):
        bb.module(0, "ffn")
    with pytest.raises(TimeromeError, match="out of range"):
        bb.module(7, "resid")
    with pytest.raises(TimeromeError, match="unknown hook point"):
        with Intervention(bb, {(0, "mlp_out"): lambda h, s: None}):
            pass
    with pytest.raises(TimeromeError, match="exceeds the model's context"):
        bb.logits(torch.zeros(1, bb.max_length + 1, dtype=torch.long))
    with pytest.raises(TimeromeError, match="no mask token"):
        _mask_id({}, type("Tok", (), {"mask_token_id": None})(), FAMILIES["diffullama"])
    with pytest.raises(TimeromeError, match="no config.json"):
        load_backbone(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dirs["timerome"], broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["model_type"] = "bert"
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TimeromeError, match="cannot tell the backbone family"):
        load_backbone(broken)


def test_hooks_removed_when_body_raises(backbones):
    bb = backbones["timerome"]
    mod = bb.module(0, "resid")
    before = len(mod._forward_hooks)
    with pytest.raises(RuntimeError):
        with Intervention(bb, {(0, "resid"): lambda h, s: h * 0}):
            raise RuntimeError("boom")
    assert len(mod._forward_hooks) == before


def test_fingerprint_distinguishes_models(tmp_path):
    a = load_backbone(make_tiny_checkpoint("timerome", tmp_path / "a", seed=0))
    b = load_backbone(make_tiny_checkpoint("timerome", tmp_path / "b", seed=1))
    a2 = load_backbone(tmp_path / "a")
    assert a.fingerprint() == a2.fingerprint() != b.fingerprint()


@pytest.mark.parametrize("family", ["timerome", "dream"])
def test_fingerprint_sees_an_edit_of_any_layer(tmp_path, family):
    bb = load_backbone(make_tiny_checkpoint(family, tmp_path / family, seed=0))
    before = bb.fingerprint()
    for name, p in bb.model.named_parameters():
        if p.dim() != 2 or "embed" in name or "wte" in name:
            continue
        with torch.no_grad():
            saved = p.clone()
            p.add_(1e-3 * torch.outer(torch.ones(p.shape[0]), torch.ones(p.shape[1])))  # rank-one edit
            assert bb.fingerprint() != before, name
            p.copy_(saved)
    assert bb.fingerprint() == before


def test_one_changed_weight_changes_the_fingerprint_and_a_memory_refuses_it(tmp_path, monkeypatch):
    """Every byte counts (the old fingerprint hashed a strided sample: this entry was not in it), and a
    memory made on one model is refused by the other."""
    from safetensors.torch import load_file, save_file

    from timerome.backbones.loading import DEFAULT_MODEL_DIR
    from timerome.data.task import forget_task
    from timerome.memory.edit_memory import EditMemory

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    other = shutil.copytree(DEFAULT_MODEL_DIR, tmp_path / "other")
    state = load_file(str(other / "model.safetensors"))
    w = state["model.transformer.blocks.1.ff_out.weight"]
    assert w.numel() // 512 > 1  # index 1 lay between the 512 sampled values
    w.view(-1)[1] += 1e-6
    save_file(state, str(other / "model.safetensors"))
    a, b = load_backbone(), load_backbone(other)
    assert a.fingerprint() != b.fingerprint()
    memory = EditMemory(a, (1, "resid"), key_metric="paper").add(forget_task("embedded", "forget01").facts[:2])
    memory.save(tmp_path / "m.safetensors")
    with pytest.raises(TimeromeError, match="built for another model"):
        EditMemory.load(tmp_path / "m.safetensors", b)


def test_a_second_load_reads_the_fingerprint_from_the_cache(tmp_path, monkeypatch):
    """The first load hashes every weight once; the next ones, of the same files, hash nothing; a file
    that changes (its size or modification time) is hashed again."""
    import os

    import timerome.backbones.backbone as B

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    ckpt = make_tiny_checkpoint("timerome", tmp_path / "m", seed=0)
    calls = []
    real = B.weights_digest
    monkeypatch.setattr(B, "weights_digest", lambda *a: calls.append(1) or real(*a))
    first = load_backbone(ckpt).fingerprint()
    assert len(calls) == 1
    again = load_backbone(ckpt)
    assert again.fingerprint() == first and len(calls) == 1  # nothing hashed
    with torch.no_grad():
        next(again.model.parameters()).add_(1.0)  # changed in memory: computed anew
    assert again.fingerprint() != first and len(calls) == 2
    weights = ckpt / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load_backbone(ckpt).fingerprint() == first and len(calls) == 3  # a touched file is hashed again


def test_the_first_load_hashes_the_weights_before_they_move_to_the_device(tmp_path, monkeypatch):
    """The digest reads the weights where the loader put them (the CPU), before `model.to(device)`: on a GPU
    nothing is copied back to hash it (an H200's first digest of 32 GB read 0.5 GB/s with those copies).
    The meta device, whose tensors have no bytes, shows it: the model loads there with its fingerprint."""
    import timerome.backbones.backbone as B

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    ckpt = make_tiny_checkpoint("timerome", tmp_path / "m", seed=0)
    seen, real = [], B.weights_digest
    monkeypatch.setattr(B, "weights_digest", lambda model, config: seen.append(
        next(model.parameters()).device.type) or real(model, config))
    meta = load_backbone(ckpt, device="meta")
    assert seen == ["cpu"] and meta.device.type == "meta"
    assert meta.known_fingerprint() == load_backbone(ckpt).fingerprint() and seen == ["cpu"]  # cached: not hashed


def test_nan_weights_are_refused_at_load_once_cached_too(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    ckpt = make_tiny_checkpoint("timerome", tmp_path / "m", seed=0)
    state = load_file(str(ckpt / "model.safetensors"))
    name = sorted(k for k in state if k.endswith("ff_out.weight"))[0]
    state[name].view(-1)[7] = float("inf")
    save_file(state, str(ckpt / "model.safetensors"))
    for _ in range(2):  # the refusal is cached with the digest
        with pytest.raises(TimeromeError, match=f"NaN or infinite.*{name}"):
            load_backbone(ckpt)


# A checkpoint's "own" modelling code, in the three shapes the official forwards have: MMaDA (a 4-D
# boolean attention_bias; a 2-D attention_mask turns it CAUSAL), Dream (a 4-D boolean attention_mask
# plus position_ids; a 2-D mask is an error) and LLaDA before 2025-10-21 (every mask silently ignored).
_REMOTE_CONFIG = """
from transformers import PretrainedConfig


class RemoteConfig(PretrainedConfig):
    model_type = "{model_type}"
"""

_REMOTE_LLADA = """
import torch
from transformers import PreTrainedModel

from timerome.backbones.llada_model import LLaDAModel, LLaDAModelLM, llada_settings
from .configuration_remote import RemoteConfig

SHAPE = "{shape}"


class RemoteModel(PreTrainedModel):
    config_class = RemoteConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.cfg = config.to_dict()
        self.settings = llada_settings(self.cfg)
        self.model = LLaDAModel(self.settings)
        self.post_init()

    def _init_weights(self, module):
        pass

    def forward(self, input_ids, attention_mask=None, attention_bias=None, **unexpected):
        assert not unexpected, unexpected
        if SHAPE == "ignores-masks":
            return LLaDAModelLM.forward(self, input_ids)
        if attention_bias is None and attention_mask is not None:  # MMaDA's quirk: causal + padding
            L = input_ids.shape[1]
            causal = torch.ones(L, L, dtype=torch.bool, device=input_ids.device).tril()
            attention_bias = causal[None, None] & attention_mask.bool()[:, None, None, :]
        return LLaDAModelLM.forward(self, input_ids, attention_bias=attention_bias)
"""

_REMOTE_DREAM = """
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


class RemoteConfig(Qwen2Config):
    model_type = "Dream"


class RemoteModel(Qwen2ForCausalLM):
    config_class = RemoteConfig

    def forward(self, input_ids, attention_mask=None, position_ids=None, **unexpected):
        assert not unexpected, unexpected
        B, L = input_ids.shape
        if attention_mask is None:  # Dream is bidirectional without a mask
            attention_mask = torch.ones(B, 1, L, L, dtype=torch.bool, device=input_ids.device)
        if attention_mask.dim() != 4:
            raise ValueError("the official Dream forward passes the mask to SDPA as is: it must be 4-D")
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
"""


def _with_remote_code(d, shape):
    cfg = json.loads((d / "config.json").read_text())
    if shape == "dream":
        (d / "modeling_remote.py").write_text(_REMOTE_DREAM)
        cfg["auto_map"] = {"AutoConfig": "modeling_remote.RemoteConfig", "AutoModel": "modeling_remote.RemoteModel"}
    else:
        (d / "configuration_remote.py").write_text(_REMOTE_CONFIG.format(model_type=cfg["model_type"]))
        (d / "modeling_remote.py").write_text(_REMOTE_LLADA.format(shape=shape))
        cfg["auto_map"] = {"AutoConfig": "configuration_remote.RemoteConfig", "AutoModel": "modeling_remote.RemoteModel"}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("family, shape", [("mmada", "mmada"), ("dream", "dream")])
def test_remote_code_gets_padding_where_its_forward_expects_it(tmp_path, family, shape):
    d = _with_remote_code(make_tiny_checkpoint(family, tmp_path / family, layers=2), shape)
    ours = load_backbone(d)
    assert type(ours.model).__name__ != "RemoteModel"  # auto_map ignored without the flag
    remote = load_backbone(d, trust_remote_code=True)
    assert type(remote.model).__name__ == "RemoteModel" and remote.family.name == family and remote.remote
    ids = _ids(ours)
    att = torch.ones(ids.shape, dtype=torch.bool)
    att[1, 6:] = False  # right padding
    sites = [(l, p) for l in range(ours.n_layers) for p in ("resid", "attn", "mlp")]
    for am in (None, att):
        keep = att if am is not None else torch.ones(ids.shape, dtype=torch.bool)
        with torch.no_grad(), capture(ours, sites) as want:
            a = ours.logits(ids, attention_mask=am)
        with torch.no_grad(), capture(remote, sites) as got:
            b = remote.logits(ids, attention_mask=am)
        torch.testing.assert_close(a[keep], b[keep], atol=1e-5, rtol=0)
        for site in sites:
            torch.testing.assert_close(want[site][0][keep], got[site][0][keep], atol=1e-5, rtol=0)
    # the padded row's real tokens see exactly what they see unpadded
    with torch.no_grad():
        alone = remote.logits(ids[1:, :6])
    torch.testing.assert_close(b[1, :6], alone[0], atol=1e-5, rtol=0)


def test_remote_code_that_ignores_padding_is_refused_on_padded_input(tmp_path):
    d = _with_remote_code(make_tiny_checkpoint("llada", tmp_path / "old", layers=2), "ignores-masks")
    ours, remote = load_backbone(d), load_backbone(d, trust_remote_code=True)
    ids = _ids(ours)
    with torch.no_grad():
        assert torch.equal(ours.logits(ids), remote.logits(ids))  # same weights, same function
        att = torch.ones(ids.shape, dtype=torch.bool)
        att[:, 6:] = False
        with pytest.raises(TimeromeError, match="ignores the padding mask"):
            remote.logits(ids, attention_mask=att)
        ours.logits(ids, attention_mask=att)  # timerome's implementation pads


def test_remote_code_runs_only_when_asked(tmp_path):
    d = _with_remote_code(make_tiny_checkpoint("llada", tmp_path / "remote", layers=2), "mmada")
    ours = load_backbone(d)
    assert type(ours.model).__name__ == "LLaDAModelLM"  # auto_map ignored without the flag
    remote = load_backbone(d, trust_remote_code=True)
    assert type(remote.model).__name__ == "RemoteModel" and remote.family.name == "llada"
    ids = _ids(ours)
    assert torch.equal(ours.logits(ids), remote.logits(ids))  # same weights, same function
    with capture(remote, [(1, "resid"), (0, "mlp")]) as got:
        remote.logits(ids)
    with capture(ours, [(1, "resid"), (0, "mlp")]) as want:
        ours.logits(ids)
    assert sorted(got) == sorted(want)
    for site in want:
        assert len(got[site]) == 1 and torch.equal(got[site][0], want[site][0])

    broken = shutil.copytree(d, tmp_path / "broken")  # another folder: the loaded module is cached
    (broken / "modeling_remote.py").write_text("raise RuntimeError('this code is broken')\n")
    with pytest.raises(TimeromeError, match="remote code failed.*this code is broken"):
        load_backbone(broken, trust_remote_code=True)
    # a weight the code's structure needs and the checkpoint lacks: refused by name, as the other loaders refuse it
    # (stop 81: it was filled randomly, with a load report on stderr and exit 0)
    from safetensors.torch import load_file, save_file

    short = shutil.copytree(d, tmp_path / "short")
    weights = load_file(str(short / "model.safetensors"))
    gone = sorted(k for k in weights if "blocks.1." in k)[0]
    save_file({k: v for k, v in weights.items() if k != gone}, str(short / "model.safetensors"),
              metadata={"format": "pt"})
    with pytest.raises(TimeromeError, match="do not fit the llada structure: .*blocks.1.* is missing"):
        load_backbone(short, trust_remote_code=True)


def test_trust_remote_code_on_a_family_without_remote_code_is_said(tmp_path, capsys):
    """The permission was dropped without a word where the family has no official remote code (the
    embedded default, an AR Llama): the run went on in timerome's implementation as if it had been read."""
    load_backbone(None, trust_remote_code=True)
    note = " ".join(capsys.readouterr().err.split())
    assert "trust_remote_code (--trust-remote-code) changes nothing for the embedded default" in note
    assert "timerome's own implementation runs" in note
    load_backbone(None)
    assert "trust_remote_code" not in capsys.readouterr().err
    d = _with_remote_code(make_tiny_checkpoint("llada", tmp_path / "remote", layers=2), "mmada")
    load_backbone(d, trust_remote_code=True)  # a family with remote code: no note
    assert "changes nothing" not in capsys.readouterr().err
    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    own = shutil.copytree(DEFAULT_MODEL_DIR, tmp_path / "own-tokenizer")  # the family has none, its tokenizer has
    (own / "tokenization_remote.py").write_text("from transformers import PreTrainedTokenizerFast\n\n\n"
                                                "class RemoteTok(PreTrainedTokenizerFast):\n    pass\n")
    tok_cfg = json.loads((own / "tokenizer_config.json").read_text())
    tok_cfg["auto_map"] = {"AutoTokenizer": [None, "tokenization_remote.RemoteTok"]}
    (own / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    bb = load_backbone(own, trust_remote_code=True)
    assert type(bb.tokenizer).__name__ == "RemoteTok" and "changes nothing" not in capsys.readouterr().err


# ------------------------------------------------------------------------------ autoregressive families

AR_NAMES = ["llama", "qwen2", "gpt2"]


@pytest.fixture(scope="module")
def ar_backbones(tmp_path_factory):
    root = tmp_path_factory.mktemp("ar")
    return {f: load_backbone(make_tiny_checkpoint(f, root / f, layers=3)) for f in AR_NAMES}


@pytest.mark.parametrize("fam", AR_NAMES)
def test_ar_family_is_detected_by_its_missing_mask_token(ar_backbones, fam):
    bb = ar_backbones[fam]
    assert bb.family.name == fam and bb.family.causal and bb.causal
    if fam == "llama":  # the same config as DiffuLLaMA's: the mask token decides
        assert any("no mask token" in e for e in bb.info["evidence"])


def test_a_llama_config_with_a_mask_token_stays_diffullama(tiny_dirs, tmp_path):
    d = shutil.copytree(tiny_dirs["diffullama"], tmp_path / "dl")
    bb = load_backbone(d)
    assert bb.family.name == "diffullama" and not bb.family.causal
    assert any("mask token is declared" in e for e in bb.info["evidence"])
    assert load_backbone(d, family="llama").family.causal  # an explicit family wins when it fits


@pytest.mark.parametrize("fam", AR_NAMES)
def test_ar_block_out_is_block_in_plus_attn_plus_mlp(ar_backbones, fam):
    bb = ar_backbones[fam]
    ids = _ids(bb)
    sites = [(None, "embed")] + [(l, p) for l in range(bb.n_layers) for p in ("resid", "attn", "mlp")]
    with torch.no_grad(), capture(bb, sites) as store:
        bb.logits(ids)
    for l in range(1, bb.n_layers):  # GPT-2 adds learned positions after the token embedding: from layer 1
        recon = store[(l - 1, "resid")][0] + store[(l, "attn")][0] + store[(l, "mlp")][0]
        torch.testing.assert_close(store[(l, "resid")][0], recon, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fam", AR_NAMES)
def test_ar_logits_are_aligned_and_causal(ar_backbones, fam):
    bb = ar_backbones[fam]
    ids = _ids(bb)
    with torch.no_grad():
        out = bb.logits(ids)
        raw = bb.model(input_ids=ids).logits
        torch.testing.assert_close(out[:, 1:], raw[:, :-1])  # logits[:, i] predicts token i from tokens < i
        torch.testing.assert_close(bb.next_logits(ids), raw[:, -1])
        ids2 = ids.clone()
        ids2[:, 5] = (ids2[:, 5] + 1 - 5) % (bb.vocab_size - 5) + 5
        changed = bb.logits(ids2)
        torch.testing.assert_close(changed[:, :6], out[:, :6])  # a token never reaches its own or earlier predictions
        assert not torch.allclose(changed[:, 6], out[:, 6])
    with pytest.raises(TimeromeError, match="autoregressive"):
        ar_backbones and load_backbone().next_logits(ids[:, :3] % 50)


@pytest.mark.parametrize("fam", AR_NAMES)
def test_ar_padding_is_invisible(ar_backbones, fam):
    bb = ar_backbones[fam]
    ids = _ids(bb)[:1]
    with torch.no_grad():
        a = bb.logits(ids)
        right = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
        att = torch.cat([torch.ones(1, ids.shape[1]), torch.zeros(1, 4)], dim=1).bool()
        torch.testing.assert_close(bb.logits(right, att)[:, : ids.shape[1]], a, atol=1e-5, rtol=1e-5)
        left = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
        att = torch.cat([torch.zeros(1, 4), torch.ones(1, ids.shape[1])], dim=1).bool()
        torch.testing.assert_close(bb.logits(left, att)[:, 5:], a[:, 1:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(bb.next_logits(left, att), bb.next_logits(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fam", AR_NAMES)
def test_ar_likelihood_is_the_exact_next_token_sum(ar_backbones, fam):
    from timerome.engine.likelihood import exact_log_likelihood, log_likelihood, log_likelihood_batch

    bb = ar_backbones[fam]
    p, a = bb.encode("the author was born in"), bb.encode("city of books")
    with torch.no_grad():
        logp = bb.model(input_ids=torch.tensor([p + a])).logits[0].log_softmax(-1)
    want = sum(float(logp[len(p) - 1 + j, t]) for j, t in enumerate(a))
    assert log_likelihood(bb, p, a, n_mc=16) == pytest.approx(want, abs=1e-4)
    assert log_likelihood(bb, p, a, n_mc=1) == log_likelihood(bb, p, a, n_mc=16)  # no Monte Carlo
    assert exact_log_likelihood(bb, p, a) == pytest.approx(want, abs=1e-4)
    batch = log_likelihood_batch(bb, [p, p[:3]], [a, a[:1]])
    assert float(batch[0]) == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("fam", AR_NAMES)
def test_ar_generation_is_greedy_left_to_right(ar_backbones, fam):
    from timerome.engine.sampler import generate

    bb = ar_backbones[fam]
    p = bb.encode("the author was born in")
    x = generate(bb, torch.tensor([p]), steps=4, gen_length=4, block_length=4)
    seq = list(p)
    specials = set(bb.tokenizer.all_special_ids) | {bb.mask_id}
    with torch.no_grad():
        for _ in range(4):  # greedy, until its end-of-text (a special token); then the placeholder
            done = seq[-1] in specials and len(seq) > len(p)
            seq.append(bb.mask_id if done else int(bb.model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    assert x[0].tolist() == seq
    # left-padded rows of different lengths decode as they do alone
    q = bb.encode("what did the author write")
    L = max(len(p), len(q))
    ids = torch.tensor([[0] * (L - len(p)) + p, [0] * (L - len(q)) + q])
    att = torch.tensor([[0] * (L - len(p)) + [1] * len(p), [0] * (L - len(q)) + [1] * len(q)]).bool()
    both = generate(bb, ids, steps=4, gen_length=4, block_length=4, attention_mask=att)
    assert both[0, L:].tolist() == seq[len(p):]
    with pytest.raises(TimeromeError, match="autoregressive"):
        generate(bb, torch.tensor([p]), steps=4, gen_length=4, block_length=4, cache="dual")


@pytest.mark.parametrize("fam", AR_NAMES)
def test_rome_and_memit_edit_an_ar_model_with_the_next_token_loss(ar_backbones, fam):
    from timerome.data.facts import Fact
    from timerome.data.task import ForgetTask
    from timerome.methods import install
    from timerome.methods._locate import masked_objective

    bb = ar_backbones[fam]
    # a random tiny model moves information between tokens weakly: the subject ends the prompt
    facts = [Fact("the author", "what did write the author", "many novels", target="sea rain night")]
    task = ForgetTask(forget_rows=[], facts=facts, retain_rows=[{"question": "what did she write ?",
                                                                   "answer": "many novels about sea"}] * 3)
    p, t = bb.encode(facts[0].prompt), bb.encode("sea rain night")

    def target_lp():
        with torch.no_grad():
            logp = bb.model(input_ids=torch.tensor([p + t])).logits[0].log_softmax(-1)
        return sum(float(logp[len(p) - 1 + j, tok]) for j, tok in enumerate(t))

    # the objective is the next-token loss: no draw, the mean -log p over target tokens
    ids, ans = torch.tensor([p + t]), torch.tensor([[False] * len(p) + [True] * len(t)])
    with torch.no_grad():
        loss = masked_objective(bb, ids, ans, torch.ones_like(ids).bool(), torch.Generator().manual_seed(0))
    assert float(loss) == pytest.approx(-target_lp() / len(t), abs=1e-4)
    before = target_lp()
    for method in ("rome", "memit"):
        edit = install(method, bb, task, {"grad_steps": 20}, seed=0)
        try:
            # a random tiny model barely moves (tests/backbones/test_real_model.py measures real edits on a real one):
            # ROME's target is more likely all the same; MEMIT's update runs (GPT-2: through its Conv1D)
            assert method == "memit" or target_lp() > before + 0.01
            assert target_lp() != before
        finally:
            edit.undo()
        assert target_lp() == pytest.approx(before, abs=1e-5)  # undo restores the weights


def test_transformers_bars_are_off_while_a_checkpoint_is_written_and_read(tmp_path, capfd):
    """transformers' tqdm bars ("Writing model shards", "Loading checkpoint shards") write carriage returns into
    logs: the one display is timerome's (common.progress.hf_bars_off, review 72: the tiny checkpoints' save
    still showed its bar). The bars' setting is as it was after."""
    from transformers.utils import logging as hf_logging

    import timerome
    from timerome.backbones.tiny import make_tiny_checkpoint

    hf_logging.enable_progress_bar()
    timerome.load_backbone(make_tiny_checkpoint("llama", tmp_path / "ar"))
    err = capfd.readouterr().err
    assert "shards" not in err and "\r" not in err, err
    assert hf_logging.is_progress_bar_enabled()


def test_the_embedded_model_is_known_by_its_folder_not_its_name(tmp_path):
    """A user's checkpoint in a folder named timerome-default was taken for the embedded model (its corpus stood
    in for the probes, the background and the calibration rows): the embedded model is the one loaded from its
    own folder (`Backbone.embedded`), however the path is written."""
    import os

    from timerome.backbones.loading import DEFAULT_MODEL_DIR, load_backbone
    from timerome.backbones.tiny import make_tiny_checkpoint
    from timerome.memory.whitening import background_texts
    from timerome.metrics.editing import embedded_probes

    mine = load_backbone(make_tiny_checkpoint("timerome", tmp_path / "timerome-default"))
    assert mine.name == "timerome-default" and not mine.embedded
    assert embedded_probes(mine, "my.json", []) is None
    with pytest.raises(TimeromeError, match="needs a background corpus for this model"):
        background_texts(mine)
    assert background_texts(load_backbone())  # the embedded corpus stands in
    assert load_backbone().embedded and load_backbone(os.path.relpath(DEFAULT_MODEL_DIR)).embedded
    assert embedded_probes(load_backbone(), "my.json", []) == "the embedded model"


def test_remote_code_loads_safetensors_only(tmp_path):
    """--trust-remote-code trusts the checkpoint's code, not pickled weights: a folder with only a .bin was
    unpickled by transformers on that path (every other path refused it)."""
    from safetensors.torch import load_file

    d = _with_remote_code(make_tiny_checkpoint("llada", tmp_path / "bin", layers=2), "mmada")
    torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    for remote in (False, True):
        with pytest.raises(TimeromeError, match="has no model.safetensors \\(pickled .bin weights are not loaded\\)"):
            load_backbone(d, trust_remote_code=remote)


def test_a_tiny_transformers_checkpoint_leaves_the_global_generator_alone(tmp_path):
    """make_tiny_checkpoint seeded torch's global generator for transformers' initialisers and left it so: a caller's
    later unseeded draws changed with the call. Now seeded inside fork_rng, with the same weights for a seed."""
    from safetensors.torch import load_file

    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    a = make_tiny_checkpoint("llama", tmp_path / "a", layers=1)
    assert torch.equal(torch.rand(3), want)
    b = make_tiny_checkpoint("llama", tmp_path / "b", layers=1)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_checkpoints_json_with_a_key_twice_loads_as_transformers_reads_it(tmp_path):
    """timerome refuses a key given twice in JSON a user writes for it (-c, config files), not in a checkpoint's
    files made elsewhere, which transformers reads as json does (the last value)."""
    d = make_tiny_checkpoint("timerome", tmp_path / "m", layers=1)
    for name in ("config.json", "tokenizer_config.json"):
        text = (d / name).read_text(encoding="utf-8")
        (d / name).write_text(text.replace("{", '{"x_dup": 1, "x_dup": 2, ', 1), encoding="utf-8")
    assert load_backbone(d).config["x_dup"] == 2
