"""Backbone families as data.

A family is a row of module-path templates and flags, nothing more: algorithms ask the
`Backbone` for "layer 7, resid" and never learn which family answered. `{i}` in a template is
the layer index. Paths are anchored at the root of the loaded model, so LLaDA's head
`model.transformer.ff_out` can never be mistaken for a block's MLP output
`model.transformer.blocks.{i}.ff_out`.

Detection (`timerome.backbones.detect`) reads the signature columns: the config keys a family
needs and must not have, and the model_type / architectures / marker keys that point to it.

Two kinds of family share the table: masked diffusion LMs (bidirectional, a mask token) and, with
`causal=True`, autoregressive LMs (causal attention, next-token likelihood, greedy left-to-right
decoding), so that the positional trace, the locate-then-edit baselines and the edit memory run on
both. Algorithms read the flag, never a family name.
"""

from __future__ import annotations

from dataclasses import dataclass

from timerome.errors import TimeromeError

HOOK_POINTS = ("resid", "attn", "mlp")

LLADA_KEYS = ("d_model", "n_layers", "n_heads")
HF_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads")
MMADA_MARKERS = ("llm_vocab_size", "codebook_size", "num_vq_tokens")
MOE_MARKERS = ("num_experts", "expert_intermediate_size", "moe_layer_freq")


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json "model_type" values that point to this family
    embed: str                    # token embedding module
    block: str                    # transformer block; its output (or output[0]) is "resid"
    attn: str                     # attention output before the residual add
    mlp: str                      # MLP output before the residual add (MoE: routed + shared expert)
    # signature: keys the config must have / must not have; architectures and marker keys that point here
    keys: tuple[str, ...] = ()
    without: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    # the read-out after the last block: final norm, then the vocabulary head ("" or a module the
    # checkpoint lacks: tied to the embedding). Backbone.readout applies them to a last-block output
    norm: str = ""
    head: str = ""
    extra_points: tuple[tuple[str, str], ...] = ()  # family-specific hook points beside the paper's three
    # with trust_remote_code=True: points whose module is elsewhere in the official code, used when
    # ours is absent, unless the official model has a module for one of `remote_unhookable_if`
    remote_points: tuple[tuple[str, str], ...] = ()
    remote_unhookable_if: tuple[str, ...] = ()
    n_layers_keys: tuple[str, ...] = ("num_hidden_layers", "n_layers")
    hidden_keys: tuple[str, ...] = ("hidden_size", "d_model")
    context_keys: tuple[str, ...] = ("max_position_embeddings", "max_sequence_length")
    mask_id: int | None = None    # default mask token id when the config/tokenizer does not say
    logit_shift: int = 0          # 1: output j-1 predicts token j (Dream, DiffuLLaMA, every causal LM)
    # autoregressive: causal attention (position i sees 0..i), exact next-token likelihood, greedy
    # left-to-right decoding, no mask token (the backbone's mask id is a placeholder for positions not
    # yet decoded, which a causal forward never reads when it predicts them)
    causal: bool = False
    # How the built-in model takes padding:
    #   "keys2d": our own implementations, and transformers' causal LMs: a [B, L] key mask as
    #             attention_mask (+ position_ids); transformers adds the causal mask to it
    #   "bias4d": transformers' Llama/Qwen2 classes: a [B, 1, L, L] boolean attention_mask, which
    #             also makes them bidirectional
    #   "additive4d": the same as an additive mask in the model dtype (0 / dtype min), DiffuLLaMA's format
    attention: str = "keys2d"
    # RoPE positions of a padded batch: "arange" (0..L-1 whatever the padding) or "from_mask"
    # (counted over real tokens: a row gets the positions it has unpadded)
    positions: str = "arange"
    # How the official forward (trust_remote_code=True) takes a padding mask:
    #   "attention_bias": a [B, 1, L, L] boolean `attention_bias` (MMaDA; LLaDA after 2025-10-21)
    #   "mask4d": a [B, 1, L, L] boolean `attention_mask` and `position_ids` (Dream's sampler)
    #   "none": the official code drops masks, padded batches are refused
    remote_padding: str = "none"
    loader: str = "transformers"  # "timerome": our own implementation; "transformers": a transformers class
    hf_class: str | None = None   # the transformers class the "transformers" loader uses: "llama" | "qwen2" | "gpt2"
    hf_attention: str = "sdpa"    # its attention implementation: the official one (dtype parity)
    needs_remote_code: bool = False  # the official implementation is remote code
    config_spec: str = ""         # which table of timerome.backbones.flags checks the config keys
    # where a generated answer ends when the model never learnt to pad with EOS (the embedded
    # model's answers all end in " ."); None: show everything the sampler produced
    answer_end: str | None = None
    # whether training pads answers with EOS where the checkpoint records no recipe (training.train.recipe_eos_pad):
    # off for the embedded model's family, whose TOFU fixture was trained without it
    eos_pad: bool = True
    # LoRA targets as one regex over module names: anchored on the block so a head that shares a
    # projection's name (LLaDA's transformer.ff_out) never gets an adapter
    lora_targets: str = r".*layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"

    def points(self) -> dict[str, str]:
        """Hook point -> module-path template ("embed" has no layer)."""
        return {"resid": self.block, "attn": self.attn, "mlp": self.mlp, **dict(self.extra_points)}


LLADA_LORA = r".*blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)"
_LLADA_PATHS = dict(embed="model.transformer.wte", block="model.transformer.blocks.{i}",
                    attn="model.transformer.blocks.{i}.attn_out", mlp="model.transformer.blocks.{i}.ff_out",
                    norm="model.transformer.ln_f", head="model.transformer.ff_out")
_HF_PATHS = dict(embed="model.embed_tokens", block="model.layers.{i}", attn="model.layers.{i}.self_attn",
                 mlp="model.layers.{i}.mlp", norm="model.norm", head="lm_head")
# an autoregressive LM run by its transformers class: causal attention as the class computes it (a
# [B, L] key mask for padding, RoPE positions counted over real tokens), aligned like Dream's logits
_CAUSAL = dict(causal=True, logit_shift=1, attention="keys2d", positions="from_mask", loader="transformers")

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            name="timerome", model_types=("timerome-llada",), keys=LLADA_KEYS, **_LLADA_PATHS,
            loader="timerome", config_spec="llada", lora_targets=LLADA_LORA, answer_end=".", eos_pad=False,
        ),
        Family(
            name="llada", model_types=("llada",), architectures=("LLaDAModelLM",), keys=LLADA_KEYS,
            without=MMADA_MARKERS + MOE_MARKERS, **_LLADA_PATHS,
            mask_id=126336, positions="from_mask",  # the official code cannot pad: truncation semantics
            remote_padding="attention_bias",  # the 2025-10-21 revision; the earlier one ignores masks (probed)
            loader="timerome", needs_remote_code=True, config_spec="llada", lora_targets=LLADA_LORA,
        ),
        Family(
            name="mmada", model_types=("mmada",), architectures=("MMadaModelLM",), keys=LLADA_KEYS,
            markers=MMADA_MARKERS, without=MOE_MARKERS, **_LLADA_PATHS,
            mask_id=126336, remote_padding="attention_bias",  # a 2-D attention_mask makes it causal
            loader="timerome", needs_remote_code=True, config_spec="mmada", lora_targets=LLADA_LORA,
        ),
        Family(
            name="llada-moe", model_types=("llada", "lladamoe", "llada_moe"), architectures=("LLaDAMoEModelLM",),
            keys=HF_KEYS + ("num_experts",), markers=MOE_MARKERS, without=("d_model",),
            embed="model.embed_tokens", block="model.layers.{i}", attn="model.layers.{i}.self_attn",
            mlp="model.layers.{i}.mlp_sum", norm="model.norm", head="lm_head",
            extra_points=(("mlp_routed", "model.layers.{i}.mlp"), ("mlp_shared", "model.layers.{i}.shared_expert")),
            remote_points=(("mlp", "model.layers.{i}.mlp"),), remote_unhookable_if=("mlp_shared",),
            mask_id=156895, positions="from_mask",  # the official code ignores masks: truncation semantics
            loader="timerome", needs_remote_code=True, config_spec="llada-moe",
            lora_targets=r".*layers\.\d+\.(self_attn\.(q|k|v|o)_proj|(mlp\.experts\.\d+|mlp|shared_expert)\.(gate|up|down)_proj)",
        ),
        Family(
            name="dream", model_types=("Dream", "dream"), architectures=("DreamModel",), keys=HF_KEYS,
            without=MOE_MARKERS + ("d_model",), **_HF_PATHS,
            mask_id=151666, logit_shift=1, attention="bias4d", positions="from_mask", remote_padding="mask4d",
            loader="transformers", hf_class="qwen2",  # Qwen2 weights; the official class is remote code
            needs_remote_code=True, config_spec="qwen2",
        ),
        Family(
            name="diffullama", model_types=("llama",), architectures=("LlamaForCausalLM",), keys=HF_KEYS,
            without=MOE_MARKERS + ("d_model",), **_HF_PATHS,
            logit_shift=1, attention="additive4d", loader="transformers", hf_class="llama", config_spec="llama",
            hf_attention="eager",  # inf_diffullama.py's default, with get_anneal_attn_mask's additive mask
        ),
        # autoregressive LMs. A Llama config is DiffuLLaMA's as well: detection tells them apart by
        # the mask token (config.json or tokenizer): an MDLM declares one, an AR model does not
        Family(
            name="llama", model_types=("llama",), architectures=("LlamaForCausalLM",), keys=HF_KEYS,
            without=MOE_MARKERS + ("d_model",), **_HF_PATHS, **_CAUSAL, hf_class="llama", config_spec="llama",
        ),
        Family(
            name="qwen2", model_types=("qwen2",), architectures=("Qwen2ForCausalLM",), keys=HF_KEYS,
            without=MOE_MARKERS + ("d_model",), **_HF_PATHS, **_CAUSAL, hf_class="qwen2", config_spec="qwen2-causal",
        ),
        Family(
            name="gpt2", model_types=("gpt2",), architectures=("GPT2LMHeadModel",), keys=("n_embd", "n_layer", "n_head"),
            embed="transformer.wte", block="transformer.h.{i}", attn="transformer.h.{i}.attn",
            mlp="transformer.h.{i}.mlp", norm="transformer.ln_f", head="lm_head", n_layers_keys=("n_layer",), hidden_keys=("n_embd",),
            context_keys=("n_positions", "n_ctx"), **_CAUSAL, hf_class="gpt2", config_spec="gpt2",
            lora_targets=r".*h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)",
        ),
    ]
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name.lower()]
    except KeyError:
        raise TimeromeError(
            f"unknown backbone family {name!r}; known families: {', '.join(sorted(FAMILIES))}"
        ) from None
