"""What `timerome info` says about a loaded backbone, as one JSON-able dict."""

from __future__ import annotations


def _special(bb, key: str, tok_attr: str, fallback=None) -> dict:
    """An id with where it came from: config.json first, then the tokenizer, then the family default."""
    tok = bb.tokenizer
    for source, value in (("config.json", bb.config.get(key)), ("tokenizer", getattr(tok, tok_attr, None)),
                          ("family default", fallback)):
        if value is not None:
            token = None
            if tok is not None and isinstance(value, int):
                try:
                    token = tok.convert_ids_to_tokens(value)
                except Exception:  # noqa: BLE001 - an id the tokenizer does not know
                    token = None
            return {"id": value, "token": token, "source": source}
    return {"id": None, "token": None, "source": "none"}


def _padding(bb) -> str:
    fam = bb.family
    if bb.remote:
        how = {"attention_bias": "a [B,1,L,L] boolean attention_bias",
               "mask4d": "a [B,1,L,L] boolean attention_mask + position_ids",
               "none": "refused (the official code ignores masks)"}[fam.remote_padding]
        problem = getattr(bb, "_padding_problem", None)
        return f"{how}; probe: {problem}" if problem else how
    how = {"keys2d": "a [B,L] key mask", "bias4d": "a [B,1,L,L] boolean attention_mask",
           "additive4d": "a [B,1,L,L] additive attention_mask"}[fam.attention]
    if fam.causal:
        how += " (causal attention)"
    pos = "positions counted over real tokens" if fam.positions == "from_mask" else "positions 0..L-1"
    return f"{how}, {pos}"


def describe(bb) -> dict:
    """Family and why, implementation, dtype, sizes, tokenizer class, special ids, hook points,
    padding convention and config keys (refused ones make loading fail: see `describe_refusal`)."""
    info = bb.info
    mask = _special(bb, "mask_token_id", "mask_token_id", bb.family.mask_id)
    mask["id"] = bb.mask_id  # the one the backbone uses (loading checked it fits the vocabulary)
    if bb.family.causal and mask["source"] == "none":
        mask["source"] = "placeholder: an autoregressive LM has no mask token (pad / eos id)"
        try:
            mask["token"] = bb.tokenizer.convert_ids_to_tokens(bb.mask_id)
        except Exception:  # noqa: BLE001 - a tokenizer without that id
            mask["token"] = None
    return {
        "name": bb.name,
        "checkpoint": info.get("checkpoint"),
        "family": bb.family.name,
        "evidence": info.get("evidence", []),
        "implementation": info.get("implementation", type(bb.model).__name__),
        "remote_code": bb.remote,
        "dtype": str(bb.dtype).removeprefix("torch."),
        "device": str(bb.device),
        "layers": bb.n_layers,
        "hidden_size": bb.hidden_size,
        "vocab_size": bb.vocab_size,
        "context": bb.max_length,
        "tokenizer": info.get("tokenizer", {"class": type(bb.tokenizer).__name__}),
        "special_ids": {"mask": mask, "eos": _special(bb, "eos_token_id", "eos_token_id"),
                        "pad": _special(bb, "pad_token_id", "pad_token_id")},
        "hook_points": {p: bb.module_path(None if p == "embed" else 0, p) for p in bb.points},
        "logit_shift": bb.family.logit_shift,
        "causal": bb.family.causal,
        "padding": _padding(bb),
        # timerome reads every prompt as given (a raw completion); lm-eval's --apply_chat_template is the one place
        # the template is applied (review 91: a user of an instruct model could not tell)
        "chat_template": bool(getattr(bb.tokenizer, "chat_template", None)),
        "config_keys": info.get("config_keys", {"refused": [], "unknown": [], "implemented": []}),
    }


def describe_refusal(err) -> dict:
    """What can be said about a checkpoint whose config was refused (no weights were loaded)."""
    return {**err.report, "refused": err.refused, "loaded": False}


def summary_rows(d: dict) -> list[tuple[str, str]]:
    """(field, value) rows of a description for a two-column table."""
    if d.get("loaded") is False:
        return [("family", str(d.get("family"))), ("detected from", "; ".join(d.get("evidence", []))),
                ("checkpoint", str(d.get("checkpoint")))] + [("refused", r) for r in d["refused"]]
    ids = d["special_ids"]

    def one(k):
        v = ids[k]
        return f"{v['id']} {v['token']!r} (from {v['source']})" if v["id"] is not None else "none"

    tok = d["tokenizer"]
    keys = d["config_keys"]
    rows = [
        ("family", d["family"]), ("detected from", "; ".join(d["evidence"])),
        ("checkpoint", str(d["checkpoint"])), ("implementation", d["implementation"]),
        ("dtype / device", f"{d['dtype']} / {d['device']}"),
        ("layers / hidden / vocab / context", f"{d['layers']} / {d['hidden_size']} / {d['vocab_size']} / {d['context']}"),
        ("tokenizer", f"{tok.get('class')} ({tok.get('how', '')})"),
        ("mask / eos / pad", f"{one('mask')} / {one('eos')} / {one('pad')}"),
        ("kind", "autoregressive (causal)" if d.get("causal") else "masked diffusion"),
        ("logit shift", str(d["logit_shift"])), ("padding", d["padding"]),
        ("chat template", "in the tokenizer, not applied: prompts are read as given (lm-eval's "
         "--apply_chat_template applies it)" if d.get("chat_template") else "none (prompts are read as given)"),
        ("refused config flags", "; ".join(keys["refused"]) or "none"),
        ("unknown config keys", ", ".join(keys["unknown"]) or "none"),
    ]
    return rows
