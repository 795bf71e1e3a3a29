"""Config keys, checked against what the official forward does with them.

Every key of a family's official config class is in one of three columns:
  implemented - our forward does with it what the official one does;
  harmless    - the official forward never reads it (ids, dropout in eval, init, training, versions);
  refused     - a value we do not implement (or the official code crashes on, or ignores while the
                value says otherwise): one TimeromeError naming the key, the value and why.
Any other key is unknown: one warning lists them all (it may change the forward in a way we
cannot see). Values are judged after the official defaults are applied, so a config that leaves
out `block_type` is judged as the official default "sequential".
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from timerome.common.checks import INT64, is_int, is_real, shown
from timerome.errors import TimeromeError

COMMON_HARMLESS = {
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id", "use_cache", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "initializer_range", "attention_dropout",
}

Rule = tuple[Callable[[Any], bool], str]  # (value is fine, why another value is refused)


# ------------------------------------------------------------------ values: the type and range of each number

def _count(v) -> bool:  # an integer >= 1 a tensor can be shaped with
    return is_int(v) and v >= 1


def _index(v) -> bool:  # a token id
    return is_int(v) and v >= 0


def _positive(v) -> bool:
    return is_real(v) and 0 < v < INT64


def _flag(v) -> bool:
    return isinstance(v, bool)


def _or_null(ok):
    return lambda v: v is None or ok(v)


def _holds(ok, v) -> bool:
    """Whether a rule accepts a value; a value of a type the rule cannot even compare (a string where it
    orders numbers, a list where it reads an object) is refused, never a TypeError."""
    try:
        return bool(ok(v))
    except Exception:  # noqa: BLE001 - a rule that cannot judge the value does not accept it
        return False


def _rope_theta(v) -> bool:  # RoPE's base: 1 or less makes every frequency 1 or more, 1e-300 NaN everywhere
    return _positive(v) and v > 1


def _names(v) -> bool:  # a list of strings
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _activation(v) -> bool:  # a name transformers' ACT2FN knows (its model classes build the MLP from it)
    from transformers.activations import ACT2FN

    return isinstance(v, str) and v in ACT2FN


def _rope_kind(v: dict) -> bool:  # the RoPE variant an object names, when it names one, is one transformers has
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = v.get("rope_type", v.get("type"))
    return kind is None or (isinstance(kind, str) and (kind == "default" or kind in ROPE_INIT_FUNCTIONS))


def _rope_scaling(v) -> bool:
    return v is None or (isinstance(v, dict) and _rope_kind(v) and _holds(_or_null(_rope_theta), v.get("rope_theta")))


def _rope_parameters(v) -> bool:  # transformers 5: one object, or one per layer type ({"full_attention": {...}})
    if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
        return all(_rope_scaling(x) for x in v.values())
    return _rope_scaling(v)


COUNT = (_count, "an integer >= 1")
POSITIVE = (_positive, "a finite number > 0")
FLAG = (_or_null(_flag), "true, false or null")
VALUES_COMMON = {
    "vocab_size": COUNT, "mask_token_id": (_or_null(_index), "a token id (an integer >= 0) or null"),
    "eos_token_id": (lambda v: v is None or _index(v) or (isinstance(v, list) and all(map(_index, v))),
                     "a token id, a list of them, or null"),
    "bos_token_id": (_or_null(_index), "a token id or null"), "pad_token_id": (_or_null(_index), "a token id or null"),
    "rms_norm_eps": POSITIVE, "rope_theta": (_rope_theta, "a finite number > 1"),
}
VALUES_LLADA = dict(VALUES_COMMON, **{
    "d_model": COUNT, "n_heads": COUNT, "n_layers": COUNT, "max_sequence_length": COUNT,
    "n_kv_heads": (_or_null(_count), "an integer >= 1 or null"), "mlp_ratio": POSITIVE,
    "mlp_hidden_size": (_or_null(_count), "an integer >= 1 or null"),
    "embedding_size": (_or_null(_count), "an integer >= 1 or null"),
    "multi_query_attention": (_or_null(_flag), "true, false or null"),
    "bias_for_layer_norm": (_or_null(_flag), "true, false or null"),
    **{k: FLAG for k in ("rope_full_precision", "attention_layer_norm", "attention_layer_norm_with_affine",
                         "input_emb_norm", "scale_logits", "layer_norm_with_affine", "include_bias",
                         "include_qkv_bias", "weight_tying")},
})
VALUES_HF = dict(VALUES_COMMON, **{
    "hidden_size": COUNT, "num_hidden_layers": COUNT, "num_attention_heads": COUNT, "max_position_embeddings": COUNT,
    "num_key_value_heads": (_or_null(_count), "an integer >= 1 or null"),
    "intermediate_size": COUNT, "head_dim": (_or_null(_count), "an integer >= 1 or null"),
    "tie_word_embeddings": FLAG, "attention_bias": FLAG, "mlp_bias": FLAG,
    "partial_rotary_factor": (lambda v: _positive(v) and v <= 1, "a number in (0, 1]"),
    "clip_qkv": (_or_null(_positive), "a number > 0 or null"), "qk_layernorm": FLAG,
    "num_experts": COUNT, "num_experts_per_tok": COUNT, "expert_intermediate_size": COUNT,
    "dense_intermediate_size": (_or_null(_count), "an integer >= 1 or null"),
    "shared_expert_intermediate_size": (lambda v: v is None or (_index(v)), "an integer >= 0 or null"),
    "moe_router_enable_expert_bias": FLAG,
    "moe_layer_freq": (lambda v: v is None or (isinstance(v, list) and all(x in (0, 1, True, False) for x in v)),
                       "a list of 0 / 1 per layer or null"),
    "max_window_layers": (_or_null(_index), "an integer >= 0 or null"),
    "sliding_window": (_or_null(_index), "an integer >= 0 or null"),
    "hidden_act": (_activation, "the name of an activation transformers knows (silu, gelu, relu, ...)"),
    "rope_scaling": (_rope_scaling, "an object with a RoPE type transformers knows (rope_type linear, dynamic, "
                                    "yarn, longrope, llama3, ...) and any rope_theta a finite number > 1, or null"),
    "rope_parameters": (_rope_parameters, "an object (or one per layer type) with a RoPE type transformers knows "
                                          "and rope_theta a finite number > 1, or null"),
    "layer_types": (_or_null(_names), "a list of layer type names (\"full_attention\", ...) or null"),
    "use_sliding_window": FLAG, "norm_topk_prob": FLAG,
    "router_num_group": (_or_null(_count), "an integer >= 1 or null"),
    "router_topk_group": (_or_null(_count), "an integer >= 1 or null"),
    "routed_scaling_factor": (_or_null(_positive), "a finite number > 0 or null"),
    "moe_router_score_function": (_or_null(lambda v: isinstance(v, str)), "a function name (\"softmax\") or null"),
})
VALUES_GPT2 = dict({k: v for k, v in VALUES_COMMON.items() if k not in ("rms_norm_eps", "rope_theta")}, **{
    "n_embd": COUNT, "n_layer": COUNT, "n_head": COUNT, "n_positions": COUNT,
    "n_inner": (_or_null(_count), "an integer >= 1 or null"), "layer_norm_epsilon": POSITIVE,
    "tie_word_embeddings": FLAG, "scale_attn_weights": FLAG,
})
VALUES = {"llada": VALUES_LLADA, "mmada": VALUES_LLADA, "llada-moe": VALUES_HF, "qwen2": VALUES_HF, "llama": VALUES_HF,
          "qwen2-causal": VALUES_HF, "gpt2": VALUES_GPT2}


class TimeromeConfigWarning(UserWarning):
    """config.json has keys timerome does not know; they might change the forward."""


def _in(*ok) -> Callable[[Any], bool]:
    return lambda v: v in ok


LLADA = dict(
    implemented={
        "d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_ratio", "mlp_hidden_size", "rope_theta",
        "rope_full_precision", "rms_norm_eps", "attention_layer_norm", "attention_layer_norm_with_affine",
        "input_emb_norm", "scale_logits", "layer_norm_with_affine", "include_bias", "include_qkv_bias",
        "bias_for_layer_norm", "weight_tying", "vocab_size", "embedding_size", "max_sequence_length",
        "multi_query_attention",
    },
    harmless={
        "residual_dropout", "embedding_dropout", "init_device", "init_fn", "init_std", "init_cutoff_factor",
        "precision",  # the training recipe's autocast; the HF forward never reads it
        "alibi_bias_max",  # only with alibi, which is refused
        "flash_attention",  # flash-attn kernel for the same unmasked attention, when installed
    },
    refused={
        "block_type": (_in("llama"), "only LLaDA's 'llama' block is implemented (the official default "
                                     "'sequential' fuses q/k/v into att_proj)"),
        "activation_type": (_in("silu", "gelu", "relu"), "the llama block gates act(ff_proj) * up_proj; "
                                                         "'swiglu' there crashes the official code"),
        "block_group_size": (_in(1), "block groups rename the weights (transformer.block_groups)"),
        "alibi": (_in(False), "the official MDM forward asserts ALiBi is off"),
        "rope": (_in(True), "the official MDM forward asserts RoPE is on"),
        "layer_norm_type": (_in("rms"), "only the 'rms' norm of the releases is implemented"),
    },
    defaults="timerome.backbones.llada_model",
)

MMADA = dict(LLADA, harmless=LLADA["harmless"] | {
    # MMadaConfig's extra keys: image tokens live in the same embedding, the text forward ignores them
    "llm_vocab_size", "codebook_size", "num_vq_tokens", "num_new_special_tokens", "new_vocab_size",
    "w_clip_vit", "llm_model_path", "gradient_checkpointing",
    "tie_word_embeddings",  # LLaDAModelLM.tie_weights follows weight_tying, not this
})

LLADA_MOE = dict(
    implemented={
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
        "max_position_embeddings", "rms_norm_eps", "rope_theta", "partial_rotary_factor", "attention_bias",
        "clip_qkv", "qk_layernorm", "num_experts", "num_experts_per_tok", "expert_intermediate_size",
        "dense_intermediate_size", "shared_expert_intermediate_size", "moe_layer_freq",
        "moe_router_enable_expert_bias", "tie_word_embeddings",
    },
    harmless={"output_router_logits", "router_aux_loss_coef"},
    refused={
        "hidden_act": (_in("silu", "gelu", "relu"), "only silu, gelu and relu experts are implemented"),
        "rope_scaling": (_in(None), "RoPE scaling is not implemented for LLaDA-MoE"),
        "norm_topk_prob": (_in(None, False), "the official LLaDA-MoE block never renormalises the top-k "
                                             "weights (it hard-codes norm_topk_prob off), so the flag's "
                                             "meaning is ambiguous"),
        "moe_router_score_function": (_in(None, "softmax"), "the official block always routes with softmax"),
        "routed_scaling_factor": (_in(None, 1, 1.0), "the official block never scales the routed output"),
        "router_num_group": (lambda v: v is None or v <= 1, "the official block has no group-limited routing"),
        "router_topk_group": (lambda v: v is None or v <= 1, "the official block has no group-limited routing"),
    },
    defaults=None,
)

QWEN2 = dict(  # Dream: Qwen2 weights in Dream's own (remote) classes; run by transformers' Qwen2
    implemented={
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings", "vocab_size",
        "max_window_layers", "sliding_window",  # only read with use_sliding_window, refused below
    },
    harmless=set(),
    refused={
        "hidden_act": (_in("silu"), "only silu is verified for Dream"),
        "rope_scaling": (_in(None), "RoPE scaling is not verified for Dream"),
        "use_sliding_window": (_in(None, False), "Dream's official SDPA attention ignores the window while "
                                                 "its flash-attention path applies it: ambiguous"),
        # how transformers 5 writes rope_theta / rope_scaling and the per-layer window
        "rope_parameters": (lambda v: v is None or v.get("rope_type", "default") == "default",
                            "RoPE scaling is not verified for Dream"),
        "layer_types": (lambda v: v is None or all(t == "full_attention" for t in v),
                        "sliding-window layers are not verified for Dream"),
    },
    defaults=None,
)

LLAMA = dict(  # DiffuLLaMA: transformers' own Llama is the official model
    implemented={
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "attention_bias",
        "mlp_bias", "head_dim", "tie_word_embeddings", "vocab_size", "rope_parameters",
    },
    harmless={"pretraining_tp"},  # 4.x splits the same matmuls into slices
    refused={},
    defaults=None,
)

QWEN2_CAUSAL = dict(  # an autoregressive Qwen2: transformers' own Qwen2 is the official model
    implemented=QWEN2["implemented"] | {"hidden_act", "rope_scaling", "use_sliding_window", "rope_parameters",
                                        "layer_types", "attention_bias", "head_dim"},
    harmless=set(),
    refused={},
    defaults=None,
)

GPT2 = dict(  # an autoregressive GPT-2: transformers' own GPT2LMHeadModel is the official model
    implemented={
        "n_embd", "n_layer", "n_head", "n_inner", "n_positions", "n_ctx", "vocab_size", "activation_function",
        "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
        "tie_word_embeddings",
    },
    harmless={"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_type", "summary_use_proj", "summary_activation",
              "summary_proj_to_labels", "summary_first_dropout", "task_specific_params", "add_cross_attention"},
    refused={},
    defaults=None,
)

SPECS = {"llada": LLADA, "mmada": MMADA, "llada-moe": LLADA_MOE, "qwen2": QWEN2, "llama": LLAMA,
         "qwen2-causal": QWEN2_CAUSAL, "gpt2": GPT2}


def _effective(spec: dict, config: dict) -> dict:
    if spec["defaults"] is None:
        return config
    from timerome.backbones.llada_model import OFFICIAL_DEFAULTS, TIMEROME_DEFAULTS

    defaults = TIMEROME_DEFAULTS if config.get("model_type") == "timerome-llada" else OFFICIAL_DEFAULTS
    return {**defaults, **config}


def _consistency(spec_name: str, c: dict) -> list[str]:
    """Combinations the official code raises on (a clear error here instead)."""
    bad = []
    if spec_name in ("llada", "mmada"):
        mqa, nkv, nh = c.get("multi_query_attention"), c.get("n_kv_heads"), c.get("n_heads")
        if mqa is not None and nkv is not None and nkv != (1 if mqa else nh):
            bad.append(f"n_kv_heads={nkv} contradicts multi_query_attention={mqa}")
        emb, voc = c.get("embedding_size"), c.get("vocab_size")
        if emb is not None and voc is not None and emb < voc:
            bad.append(f"embedding_size={emb} is smaller than vocab_size={voc}")
    if spec_name == "llada-moe":
        freq, n = c.get("moe_layer_freq"), c.get("num_hidden_layers")
        if freq and len(freq) < (n or 0):
            bad.append(f"moe_layer_freq has {len(freq)} entries for {n} layers")
        if freq and not all(freq) and not c.get("dense_intermediate_size"):
            bad.append("moe_layer_freq has dense layers but dense_intermediate_size is not set")
    return bad


class RefusedConfig(TimeromeError):
    """config.json asks for a forward timerome does not implement; `.refused` lists the keys."""

    def __init__(self, refused: list[str], report: dict | None = None):
        super().__init__("config.json asks for what timerome does not implement: " + "; ".join(refused))
        self.refused = refused
        self.report = report or {}  # family and detection evidence, for `timerome info`


def check_config(spec_name: str, config: dict, *, warn: bool = True) -> dict:
    """{"refused": [...], "unknown": [...], "implemented": [...]} for a config.json.

    refused: "key=value (why)" for each value we do not implement; `load_backbone` raises
    RefusedConfig on any. unknown: keys in no column, reported in one warning.
    """
    spec = SPECS[spec_name]
    c = _effective(spec, config)
    refused = []
    for key, (ok, why) in spec["refused"].items():
        if key in c and not _holds(ok, c[key]):
            shown = "absent, official default " if key not in config else ""
            refused.append(f"{key}={shown}{c[key]!r} ({why})")
    refused += _consistency(spec_name, c)
    known = COMMON_HARMLESS | spec["implemented"] | spec["harmless"] | set(spec["refused"])
    unknown = sorted(k for k in config if k not in known)
    if unknown and warn:
        warnings.warn(f"config.json has keys timerome does not know, which may change the forward: "
                      f"{', '.join(unknown)}", TimeromeConfigWarning, stacklevel=3)
    implemented = sorted(k for k in config if k in spec["implemented"] or k in spec["refused"])
    return {"refused": refused, "unknown": unknown, "implemented": implemented}


def check_values(spec_name: str, config: dict, where: str = "config.json") -> None:
    """Every number and flag of config.json the forward reads, of its type and range (a NaN eps, a
    string layer count, zero heads, a head count that does not divide the width): one error naming
    the key, before anything is built."""
    for key, (ok, want) in VALUES[spec_name].items():
        if key in config and not _holds(ok, config[key]):
            raise TimeromeError(f"{where}: {key} must be {want}, got {shown(config[key])}")
    c = _effective(SPECS[spec_name], config)
    if spec_name in ("llada", "mmada"):
        ratio, width = c.get("mlp_ratio"), c.get("d_model")
        if c.get("mlp_hidden_size") is None and _count(width) and not (_positive(ratio) and
                                                                      float(ratio * width).is_integer()):
            # the MLP width is mlp_ratio * d_model: a whole number of units, or no MLP can be built
            raise TimeromeError(f"{where}: mlp_hidden_size is null, so the MLP width is mlp_ratio * d_model, and "
                                f"mlp_ratio {shown(ratio)} * d_model {width} is not a whole number > 0; set "
                                "mlp_hidden_size (an integer >= 1) or a mlp_ratio that gives one")
        d, nh, nkv = c.get("d_model"), c.get("n_heads"), c.get("n_kv_heads")
        pairs = [("d_model", d, "n_heads", nh), ("n_heads", nh, "n_kv_heads", nkv)]
    else:
        d, nh, nkv = c.get("hidden_size"), c.get("num_attention_heads"), c.get("num_key_value_heads")
        pairs = [("num_attention_heads", nh, "num_key_value_heads", nkv)]
        if c.get("head_dim") is None:
            pairs.insert(0, ("hidden_size", d, "num_attention_heads", nh))
        if _count(c.get("num_experts_per_tok")) and _count(c.get("num_experts")) and \
                c["num_experts_per_tok"] > c["num_experts"]:
            raise TimeromeError(f"{where}: num_experts_per_tok {c['num_experts_per_tok']} exceeds num_experts "
                                f"{c['num_experts']}")
    for a, va, b, vb in pairs:
        if _count(va) and _count(vb) and va % vb:
            raise TimeromeError(f"{where}: {a} {va} is not divisible by {b} {vb}")


def parameter_count(spec_name: str, config: dict) -> int:
    """About how many parameters the config describes (embeddings, attention, MLPs or experts): what
    loading will allocate, estimated before anything is (`checks.memory_budget`)."""
    c = _effective(SPECS[spec_name], config)
    if spec_name in ("llada", "mmada"):
        d, L, nh = c.get("d_model") or 0, c.get("n_layers") or 0, c.get("n_heads") or 1
        nkv = c.get("n_kv_heads") or (1 if c.get("multi_query_attention") else nh)
        ff = c.get("mlp_hidden_size") or int((c.get("mlp_ratio") or 4) * d)
        V = c.get("embedding_size") or c.get("vocab_size") or 0
        head = 0 if c.get("weight_tying") else V * d
        return V * d + head + L * (2 * d * d + 2 * d * (d // nh) * nkv + 3 * d * ff)
    d, L, nh = c.get("hidden_size") or 0, c.get("num_hidden_layers") or 0, c.get("num_attention_heads") or 1
    hd = c.get("head_dim") or d // nh
    nkv = c.get("num_key_value_heads") or nh
    V = c.get("vocab_size") or 0
    if c.get("num_experts"):
        mlp = c["num_experts"] * 3 * d * (c.get("expert_intermediate_size") or 0) + d * c["num_experts"] + \
            3 * d * (c.get("shared_expert_intermediate_size") or 0)
    else:
        mlp = 3 * d * (c.get("intermediate_size") or 0)
    head = 0 if c.get("tie_word_embeddings") else V * d
    return V * d + head + L * (2 * d * nh * hd + 2 * d * nkv * hd + mlp)


def transformers_refusal(where, error: Exception, config: dict, whose: str) -> TimeromeError:
    """transformers' own refusal of a config.json (its config classes validate their fields) as one line naming
    the file and the key: `whose` names the class that refused ("transformers' LlamaConfig")."""
    import re

    text = " ".join(str(error).split())
    text = re.sub(r"<class '([\w.]+)'>", r"\1", text).split(" Errors: ")[0]  # "(int, NoneType)", the first reason
    field = re.match(r"Validation error for field '([^']+)': (?:\w+: )?(.*)", text)
    if field:
        key, why = field.groups()
        if key not in config and key == "rope_parameters" and "rope_scaling" in config:
            key = "rope_scaling"  # transformers 5 reads rope_scaling into rope_parameters
        value = shown(config[key]) if key in config else "(absent)"
        return TimeromeError(f"{where}: {key} {value} is refused by {whose}: {_words(why)}")
    check = re.match(r"Class validation error for validator '([^']+)': (?:\w+: )?(.*)", text)
    if check:
        return TimeromeError(f"{where}: {whose} refuses it ({check.group(1)}): {_words(check.group(2))}")
    return TimeromeError(f"{where}: {whose} cannot be built from it: {_words(text) or type(error).__name__}")


def _words(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."
