"""The tokenizer of a checkpoint, without running its remote code when its files are a standard format.

Some releases name a remote-code tokenizer class (Dream: `tokenization_dream.DreamTokenizer`, a
slow copy of Qwen2's) while their files are a format transformers reads natively: `tokenizer.json`,
`vocab.json` + `merges.txt` (byte-level BPE) or a sentencepiece `tokenizer.model`. Those load
through the matching transformers class; the special tokens (mask, eos, pad, ...) come from the
release's tokenizer_config.json / special_tokens_map.json as usual. Remote tokenizer code runs
only with trust_remote_code=True.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from timerome.backbones.flags import transformers_refusal
from timerome.common.checks import shown
from timerome.common.files import read_json
from timerome.errors import TimeromeError

# remote tokenizer class -> the transformers class with the same pre-tokenisation and files
REMOTE_TOKENIZERS = {
    "DreamTokenizer": "Qwen2Tokenizer",  # Qwen2's regex, NFC normalisation, byte-level BPE
}
# what to use for an unknown remote class, by the files the release has (first present wins)
BY_FILES = (
    (("tokenizer.json",), "PreTrainedTokenizerFast"),  # the file describes the whole pipeline
    (("vocab.json", "merges.txt"), "GPT2Tokenizer"),   # byte-level BPE; pre-tokenisation assumed GPT-2's
    (("tokenizer.model",), "LlamaTokenizer"),          # sentencepiece; normalisation assumed Llama's
)


def _read(path: Path) -> dict:
    """A tokenizer file of the checkpoint as JSON ({} where it has none): UTF-8, a JSON object, one clear
    error otherwise."""
    if not path.exists():
        return {}
    doc = read_json(path, "the checkpoint's tokenizer file", finite=False, keys_once=False)
    if not isinstance(doc, dict):
        raise TimeromeError(f"{path} must be a JSON object (the tokenizer's settings by name), got a "
                            f"{type(doc).__name__}")
    return doc


def _auto_tokenizer(cfg: dict, path: Path) -> str | None:
    """The remote tokenizer class a file's auto_map names ("module.Class"), or None; a map of another shape
    is refused by name. tokenizer_config.json may hold the legacy form, a list [slow, fast] itself."""
    amap = cfg.get("auto_map")
    if amap is None:
        return None
    if isinstance(amap, list) and path.name == "tokenizer_config.json":
        auto = amap
    elif isinstance(amap, dict):
        auto = amap.get("AutoTokenizer")
    else:
        raise TimeromeError(f"{path}: auto_map must be an object naming the code of each Auto class "
                            f"({{\"AutoTokenizer\": [...], ...}}), got {shown(amap)}")
    refs = [auto] if isinstance(auto, str) else auto if isinstance(auto, (list, tuple)) else None
    if auto is not None and (refs is None or not all(r is None or isinstance(r, str) for r in refs)):
        raise TimeromeError(f"{path}: auto_map's AutoTokenizer must be a class reference (\"module.Class\") or a "
                            f"list [slow, fast] of them (null for none), got {shown(auto)}")
    named = [r for r in refs or () if r]
    return named[0] if named else None


def _is_remote(ckpt: Path, tok_cfg: dict, config: dict) -> str | None:
    """The remote class the release names, or None when transformers has the class itself."""
    import transformers

    for cfg, path in ((tok_cfg, ckpt / "tokenizer_config.json"), (config, ckpt / "config.json")):
        ref = _auto_tokenizer(cfg, path)
        if ref:
            return ref
    name = tok_cfg.get("tokenizer_class")
    if name is not None and not isinstance(name, str):
        raise TimeromeError(f"{ckpt / 'tokenizer_config.json'}: tokenizer_class must be a class name (a string) "
                            f"or null, got {shown(name)}")
    if name and not hasattr(transformers, name) and not hasattr(transformers, name.removesuffix("Fast")):
        return name
    return None


def load_tokenizer(ckpt: Path, config: dict, trust_remote_code: bool = False):
    """(tokenizer, info) where info says which class was used and why."""
    import transformers
    from transformers.utils import logging as hf_logging

    tok_cfg = _read(ckpt / "tokenizer_config.json")
    remote = _is_remote(ckpt, tok_cfg, config)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # it warns about our model_type while it reads config.json
    try:
        with warnings.catch_warnings():
            # AutoTokenizer also reads config.json through a generic config class, which warns
            # about keys of the release's era (rope_scaling); none of it reaches the tokenizer
            warnings.simplefilter("ignore", FutureWarning)
            if remote is None and tok_cfg.get("tokenizer_class") == "PreTrainedTokenizerFast" and \
                    (ckpt / "tokenizer.json").is_file():
                # the release names the generic class: transformers 5's AutoTokenizer would pick the
                # model_type's own class instead (qwen2 -> Qwen2Tokenizer) and misread a tokenizer.json
                tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(ckpt))
                how = "PreTrainedTokenizerFast from tokenizer.json, as the release names it"
            elif remote is None or trust_remote_code:
                tok = transformers.AutoTokenizer.from_pretrained(str(ckpt), trust_remote_code=trust_remote_code)
                how = ("the release's remote code (trust_remote_code)" if remote else
                       f"AutoTokenizer for the release's {tok_cfg.get('tokenizer_class') or 'files'}")
            else:
                cls_name, files = _standard_class(ckpt, remote)
                tok = getattr(transformers, cls_name).from_pretrained(str(ckpt))
                how = f"{cls_name} from {' + '.join(files)} instead of the remote {remote}"
    except TimeromeError:
        raise
    except Exception as e:  # noqa: BLE001 - any tokenizer failure becomes one clear message
        try:
            from huggingface_hub.errors import StrictDataclassError
        except ImportError:  # an older huggingface_hub: its transformers validates no field this way
            StrictDataclassError = ()  # noqa: N806 - isinstance(e, ()) is False

        if isinstance(e, StrictDataclassError):  # AutoTokenizer reads config.json through its config class
            raise transformers_refusal(ckpt / "config.json", e, config,
                                       f"transformers' config class for model_type {config.get('model_type')!r}"
                                       ) from None
        files = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model", "qwen.tiktoken")
        have = [f for f in files if (Path(ckpt) / f).exists()]
        why = " ".join(str(e).split())
        why = why if len(why) <= 300 else why[:300].rsplit(" ", 1)[0] + " ..."  # whole words
        raise TimeromeError(f"could not load a tokenizer from {ckpt}" + (
            f" (it holds no tokenizer file: none of {', '.join(files)})" if not have else "") + f": {why}") from None
    finally:
        hf_logging.set_verbosity(level)
    _specials_in_vocabulary(ckpt, tok, tok_cfg)
    return tok, {"class": type(tok).__name__, "how": how, "release_class": remote or tok_cfg.get("tokenizer_class"),
                 "remote_code": bool(remote and trust_remote_code)}


SPECIAL_ROLES = ("mask", "eos", "pad", "bos")  # the special tokens timerome writes or reads by their id


def _specials_in_vocabulary(ckpt: Path, tok, tok_cfg: dict) -> None:
    """Refuse a special token (mask, end-of-text, padding, start) the tokenizer's files declare
    (tokenizer_config.json, special_tokens_map.json) but its vocabulary lacks: transformers appends it as a
    new id, one whose embedding no training ever saw (review 88: an invented end-of-text was read as the
    model's own, id 306 of a padded 320-row embedding, and the sampler wrote garbage with exit 0)."""
    for role in SPECIAL_ROLES:
        token, tid = getattr(tok, f"{role}_token", None), getattr(tok, f"{role}_token_id", None)
        if token is None or not isinstance(tid, int) or tid < (getattr(tok, "vocab_size", None) or 0):
            continue
        if tid in _file_token_ids(ckpt, tok_cfg):
            continue
        name = {"eos": "end-of-text", "pad": "padding", "bos": "start"}.get(role, role)
        raise TimeromeError(f"the tokenizer of {ckpt} declares the {name} token {str(token)!r}, which is not in "
                            f"its vocabulary (its {role}_token: transformers would add it as a new, untrained id "
                            f"{tid}); declare one the vocabulary holds" + ("" if role == "mask" else ", or none"))


def _file_token_ids(ckpt: Path, tok_cfg: dict):
    """The ids of the added tokens the tokenizer's files list (tokenizer_config.json's added_tokens_decoder,
    added_tokens.json, tokenizer.json's added_tokens), read lazily: the cheapest file first."""
    for key in tok_cfg.get("added_tokens_decoder") or {}:
        if str(key).isdigit():
            yield int(key)
    for name, read in (("added_tokens.json", lambda d: d.values() if isinstance(d, dict) else ()),
                       ("tokenizer.json", lambda d: [t.get("id") for t in d.get("added_tokens") or ()
                                                     if isinstance(t, dict)] if isinstance(d, dict) else ())):
        if (ckpt / name).is_file():
            try:
                yield from read(read_json(ckpt / name, "the checkpoint's tokenizer file", finite=False,
                                          keys_once=False))
            except (TimeromeError, AttributeError):  # a file the tokenizer read differently: no ids from it
                continue


def _standard_class(ckpt: Path, remote: str) -> tuple[str, tuple[str, ...]]:
    short = remote.rsplit(".", 1)[-1]
    for files, fallback in BY_FILES:
        if all((ckpt / f).exists() for f in files):
            cls = REMOTE_TOKENIZERS.get(short)
            if cls is None:
                cls = fallback
                if fallback != "PreTrainedTokenizerFast":
                    warnings.warn(f"{ckpt}: tokenizer class {short} is remote code; loading its "
                                  f"{' + '.join(files)} with transformers' {cls} (pre-tokenisation assumed "
                                  f"to be {cls}'s; pass trust_remote_code=True to run the release's class)",
                                  stacklevel=3)
            return cls, files
    raise TimeromeError(
        f"the tokenizer of {ckpt} is remote code ({remote}) and its files are no standard format "
        "(tokenizer.json, vocab.json + merges.txt, tokenizer.model); pass trust_remote_code=True to run it")


def start_ids(tokenizer) -> list[int]:
    """The ids the tokenizer puts before a text that starts a sequence (Llama-2's `<s>`), read by
    encoding one word with and without its special tokens; [] when it adds none or cannot say."""
    try:
        whole = list(tokenizer("a", add_special_tokens=True)["input_ids"])
        bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    except (TypeError, ValueError, KeyError, AttributeError, NotImplementedError):
        return []
    for i in range(len(whole) - len(bare) + 1):
        if whole[i:i + len(bare)] == bare:
            return [int(t) for t in whole[:i]]
    return []
