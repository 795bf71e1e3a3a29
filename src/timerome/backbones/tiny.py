"""Tiny random-initialised checkpoints of every family's structure, for adapter tests.

`make_tiny_checkpoint(family, directory)` writes a Hugging Face-layout directory
(config.json, model.safetensors, tokenizer files) that `load_backbone` reads like a real one.
Transformers classes are used where the library has them (Llama for DiffuLLaMA, Qwen2 for
Dream); our own implementation otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from timerome.common.progress import hf_bars_off
from timerome.backbones.llada_model import build_model, save_model
from timerome.errors import TimeromeError

WORDS = ("the author was born in city of books and wrote many novels about sea rain night "
         "what where when who is did write her his first award prize genre mystery poetry").split()


def _tokenizer(directory: Path):
    from timerome.data.tokenizer import build_word_tokenizer, save_tokenizer

    tok = build_word_tokenizer([" ".join(WORDS) + " ? ."])
    save_tokenizer(tok, directory)
    return tok


# the keys of the released configs (LLaDA-8B, MMaDA-8B, LLaDA-MoE-7B-A1B), at tiny sizes
LLADA_RELEASE_KEYS = dict(
    architectures=["LLaDAModelLM"], activation_type="silu", alibi=False, alibi_bias_max=8.0,
    attention_dropout=0.0, attention_layer_norm=False, attention_layer_norm_with_affine=True,
    bias_for_layer_norm=False, block_group_size=1, block_type="llama", embedding_dropout=0.0,
    flash_attention=False, include_bias=False, include_qkv_bias=False, init_cutoff_factor=None,
    init_device="meta", init_fn="mitchell", init_std=0.02, input_emb_norm=False, layer_norm_type="rms",
    layer_norm_with_affine=True, mlp_ratio=4, multi_query_attention=None, precision="amp_bf16",
    residual_dropout=0.0, rope=True, rope_full_precision=True, scale_logits=False, use_cache=False,
    weight_tying=False,
)
MMADA_KEYS = dict(architectures=["MMadaModelLM"], codebook_size=8, num_vq_tokens=4, num_new_special_tokens=0,
                  w_clip_vit=False, tie_word_embeddings=False)
LLADA_MOE_RELEASE_KEYS = dict(
    architectures=["LLaDAMoEModelLM"], attention_bias=False, attention_dropout=0.0, clip_qkv=None,
    hidden_act="silu", moe_router_enable_expert_bias=None, moe_router_score_function="softmax",
    norm_topk_prob=False, output_router_logits=False, partial_rotary_factor=1, qk_layernorm=True,
    rope_scaling=None, routed_scaling_factor=1, router_aux_loss_coef=0.01, router_num_group=None,
    router_topk_group=None, tie_word_embeddings=False, use_cache=False,
)


def make_tiny_checkpoint(family: str, directory: str | Path, *, layers: int = 2, hidden: int = 32,
                         seed: int = 0) -> Path:
    """A tiny random checkpoint of `family`'s structure, with the release's config keys (our own
    word tokenizer). The LLaDA-MoE one has a shared expert and GQA, which the release does not."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(d)
    vocab, mask = len(tok), int(tok.mask_token_id)
    if family in ("timerome", "llada", "mmada"):
        cfg = dict(model_type={"timerome": "timerome-llada"}.get(family, family), d_model=hidden,
                   n_layers=layers, n_heads=4, n_kv_heads=4, mlp_hidden_size=2 * hidden,
                   vocab_size=vocab, embedding_size=vocab, max_sequence_length=128,
                   rope_theta=10000.0, rms_norm_eps=1e-5, mask_token_id=mask, weight_tying=False)
        if family != "timerome":
            cfg.update(LLADA_RELEASE_KEYS)
        if family == "mmada":
            cfg.update(MMADA_KEYS, llm_vocab_size=vocab, new_vocab_size=vocab)
        save_model(build_model(cfg, seed=seed), d)
    elif family == "llada-moe":
        cfg = dict(LLADA_MOE_RELEASE_KEYS, model_type="llada", hidden_size=hidden, num_hidden_layers=layers,
                   num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                   expert_intermediate_size=hidden, dense_intermediate_size=2 * hidden,
                   shared_expert_intermediate_size=hidden, moe_layer_freq=[1] * layers, vocab_size=vocab,
                   max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-5, mask_token_id=mask)
        save_model(build_model(cfg, seed=seed), d)
    elif family in ("dream", "diffullama"):
        _transformers_tiny(family, d, vocab, mask, layers, hidden, seed)
    elif family in ("llama", "qwen2", "gpt2"):  # autoregressive: the tokenizer declares no mask token
        _transformers_tiny(family, d, vocab, mask, layers, hidden, seed)
        _drop_mask_token(d)
    else:
        raise TimeromeError(f"no tiny checkpoint recipe for family {family!r}")
    return d


def _transformers_tiny(family, d: Path, vocab, mask, layers, hidden, seed):
    import transformers

    # transformers' initialisers draw from the global generator: seeded for this build only, the caller's left as it was
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, tie_word_embeddings=False)
        if family in ("dream", "qwen2"):
            model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
        elif family == "gpt2":
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
                vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=128, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=None))
        else:
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    with hf_bars_off():  # transformers' "Writing model shards" bar
        model.save_pretrained(str(d), safe_serialization=True)
    cfg = json.loads((d / "config.json").read_text())
    if family == "dream":
        cfg.update(model_type="Dream", architectures=["DreamModel"], mask_token_id=mask)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def _drop_mask_token(d: Path) -> None:
    """An autoregressive model's tokenizer: the same files without a mask token."""
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = d / name
        if path.is_file():
            cfg = json.loads(path.read_text())
            cfg.pop("mask_token", None)
            path.write_text(json.dumps(cfg, indent=2))


# LLaDA-8B's shapes (LLaDA-8B-Instruct's config.json: d_model, mlp_hidden_size, n_heads, n_layers, vocab_size),
# for the speed benchmarks that time a forward of that size
LLADA_8B = dict(hidden=4096, mlp=12288, heads=32, layers=32, vocab=126464)


def random_backbone(device="cpu", hidden: int = 1024, layers: int = 8, vocab: int = 4096, context: int = 512,
                    mlp: int | None = None, heads: int | None = None, *, copy_blocks: bool = False,
                    tokenizer=None, dtype: torch.dtype | None = None):
    """A random LLaDA-structure model (weights from seed 0) wrapped as a Backbone: what the speed
    benchmarks time at sizes no shipped model has. mlp: the MLP's hidden size (default 8/3 of `hidden`,
    rounded down to 64); heads: attention heads (default hidden / 64). copy_blocks: build one random block
    and fill the other `layers - 1` places with copies of it (a block's time does not depend on its
    values; LLaDA-8B's 32 blocks in float32 take minutes to draw on a CPU). Its copies share its init
    scale, so their logits are this random model's, not a trained one's. tokenizer: a tokenizer whose
    ids are all below `vocab` (`tokenizer_for_random`), whose mask token becomes the model's, so the model
    reads text; None: ids only, the mask token the last id. dtype: cast before the copies are made (so
    LLaDA-8B's shapes in bfloat16 need 16 GB on the device, not the 32 of float32 first)."""
    import copy

    from timerome.backbones.backbone import Backbone
    from timerome.backbones.families import get_family

    heads = heads or hidden // 64
    if tokenizer is not None and getattr(tokenizer, "mask_token_id", None) is None:
        raise TimeromeError("the tokenizer has no mask token: a masked diffusion model needs one")
    mask = vocab - 1 if tokenizer is None else int(tokenizer.mask_token_id)
    if tokenizer is not None and len(tokenizer) > vocab:
        raise TimeromeError(f"the tokenizer has {len(tokenizer)} ids, more than the model's vocabulary of {vocab}")
    cfg = dict(model_type="timerome-llada", d_model=hidden, n_layers=1 if copy_blocks else layers, n_heads=heads,
               n_kv_heads=heads, mlp_hidden_size=mlp or int(hidden * 8 / 3) // 64 * 64, vocab_size=vocab,
               embedding_size=vocab, max_sequence_length=context, rope_theta=10000.0, rms_norm_eps=1e-5,
               mask_token_id=mask, weight_tying=False)
    model = build_model(cfg, seed=0).to(device, dtype)
    if copy_blocks:
        blocks = model.model.transformer.blocks
        while len(blocks) < layers:
            blocks.append(copy.deepcopy(blocks[0]))
        cfg = dict(cfg, n_layers=layers)
        model.cfg = dict(cfg)  # what save_model writes
    return Backbone(model, tokenizer, get_family("timerome"), cfg, mask_id=mask, name=f"random-d{hidden}")


def tokenizer_for_random(directory: str | Path):
    """The tiny checkpoints' word tokenizer (written to `directory`), for `random_backbone(tokenizer=...)`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    return _tokenizer(d)
