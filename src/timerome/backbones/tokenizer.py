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
    """A tokenizer file of the checkpoint as JSON ({} where it has none): UTF-8, one clear error otherwise."""
    return read_json(path, "the checkpoint's tokenizer file", finite=False, keys_once=False) if path.exists() else {}


def _is_remote(ckpt: Path, tok_cfg: dict, config: dict) -> str | None:
    """The remote class the release names, or None when transformers has the class itself."""
    import transformers

    for cfg in (tok_cfg, config):
        auto = (cfg.get("auto_map") or {}).get("AutoTokenizer")
        if auto:
            ref = auto[0] if isinstance(auto, (list, tuple)) else auto
            return str(ref or auto[1])
    name = tok_cfg.get("tokenizer_class")
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
        files = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model", "qwen.tiktoken")
        have = [f for f in files if (Path(ckpt) / f).exists()]
        why = " ".join(str(e).split())
        why = why if len(why) <= 300 else why[:300].rsplit(" ", 1)[0] + " ..."  # whole words
        raise TimeromeError(f"could not load a tokenizer from {ckpt}" + (
            f" (it holds no tokenizer file: none of {', '.join(files)})" if not have else "") + f": {why}") from None
    finally:
        hf_logging.set_verbosity(level)
    return tok, {"class": type(tok).__name__, "how": how, "release_class": remote or tok_cfg.get("tokenizer_class"),
                 "remote_code": bool(remote and trust_remote_code)}


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
