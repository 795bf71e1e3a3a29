"""Backbone families as data.

A family is a row of module-path templates and flags, nothing more: algorithms ask the
`Backbone` for "layer 7, resid" and never learn which family answered. `{i}` in a template is
the layer index. Paths are anchored at the root of the loaded model, so LLaDA's head
`model.transformer.ff_out` can never be mistaken for a block's MLP output
`model.transformer.blocks.{i}.ff_out`.
"""

from __future__ import annotations

from dataclasses import dataclass

from timerome.errors import TimeromeError

HOOK_POINTS = ("resid", "attn", "mlp")


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json "model_type" values that select this family
    embed: str                    # token embedding module
    block: str                    # transformer block; its output (or output[0]) is "resid"
    attn: str                     # attention output before the residual add
    mlp: str                      # MLP output before the residual add (MoE: routed + shared expert)
    n_layers_keys: tuple[str, ...] = ("num_hidden_layers", "n_layers")
    hidden_keys: tuple[str, ...] = ("hidden_size", "d_model")
    context_keys: tuple[str, ...] = ("max_position_embeddings", "max_sequence_length")
    mask_id: int | None = None    # default mask token id when the config/tokenizer does not say
    logit_shift: int = 0          # 1: output j-1 predicts token j (Dream, DiffuLLaMA)
    # How bidirectional attention and padding are passed:
    #   "bias4d": a 4-D boolean mask [B,1,L,L] (Llama/Qwen2 classes turn bidirectional with it;
    #             MMaDA turns causal on a 2-D mask, so it gets this too)
    #   "none":   natively bidirectional model that takes a 2-D attention_mask
    attention: str = "none"
    loader: str = "transformers"  # "timerome": our own implementation; "transformers": Auto classes
    needs_remote_code: bool = False  # the official implementation is remote code
    # LoRA targets as one regex over module names: anchored on the block so a head that shares a
    # projection's name (LLaDA's transformer.ff_out) never gets an adapter
    # where a generated answer ends when the model never learnt to pad with EOS (the embedded
    # model's answers all end in " ."); None: show everything the sampler produced
    answer_end: str | None = None
    lora_targets: str = r".*layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"


LLADA_LORA = r".*blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)"

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            name="timerome",
            model_types=("timerome-llada",),
            embed="model.transformer.wte",
            block="model.transformer.blocks.{i}",
            attn="model.transformer.blocks.{i}.attn_out",
            mlp="model.transformer.blocks.{i}.ff_out",
            loader="timerome",
            lora_targets=LLADA_LORA,
            answer_end=".",
        ),
        Family(
            name="llada",
            model_types=("llada",),
            embed="model.transformer.wte",
            block="model.transformer.blocks.{i}",
            attn="model.transformer.blocks.{i}.attn_out",
            mlp="model.transformer.blocks.{i}.ff_out",
            mask_id=126336,
            loader="timerome",  # our implementation reads LLaDA's weight names; remote code on request
            needs_remote_code=True,
            lora_targets=LLADA_LORA,
        ),
        Family(
            name="mmada",
            model_types=("mmada",),
            embed="model.transformer.wte",
            block="model.transformer.blocks.{i}",
            attn="model.transformer.blocks.{i}.attn_out",
            mlp="model.transformer.blocks.{i}.ff_out",
            mask_id=126336,
            attention="bias4d",
            loader="timerome",
            needs_remote_code=True,
            lora_targets=LLADA_LORA,
        ),
        Family(
            name="llada-moe",
            model_types=("lladamoe", "llada_moe"),
            embed="model.embed_tokens",
            block="model.layers.{i}",
            attn="model.layers.{i}.self_attn",
            mlp="model.layers.{i}.mlp",
            mask_id=156895,
            loader="timerome",
            needs_remote_code=True,
            lora_targets=r".*layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(shared_expert|experts\.\d+)\.(gate|up|down)_proj)",
        ),
        Family(
            name="dream",
            model_types=("Dream", "dream"),
            embed="model.embed_tokens",
            block="model.layers.{i}",
            attn="model.layers.{i}.self_attn",
            mlp="model.layers.{i}.mlp",
            mask_id=151666,
            logit_shift=1,
            attention="bias4d",
            loader="transformers",  # Qwen2 weights; official class is remote code
            needs_remote_code=True,
        ),
        Family(
            name="diffullama",
            model_types=("llama",),
            embed="model.embed_tokens",
            block="model.layers.{i}",
            attn="model.layers.{i}.self_attn",
            mlp="model.layers.{i}.mlp",
            logit_shift=1,
            attention="bias4d",
            loader="transformers",
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


def family_for_model_type(model_type: str | None) -> Family:
    for fam in FAMILIES.values():
        if model_type in fam.model_types:
            return fam
    raise TimeromeError(
        f"cannot tell the backbone family from config.json model_type={model_type!r}; "
        f"pass family= one of {', '.join(sorted(FAMILIES))}"
    )
