"""A GGUF file as a checkpoint folder: dequantised once by transformers, then cached.

`load_backbone("model.gguf")` reads the file with transformers' GGUF reader (the `gguf` package;
quantised tensors are dequantised to float32), writes the weights (safetensors), config.json and
tokenizer to the cache, named by the file's content digest, and loads that folder like any other
checkpoint: family detection, config checks and everything after are the same. Converting
SmolLM2-135M's 93 MB file took 41-49 s once on a 2-core AMD EPYC (two runs; transformers' tokenizer 10 s, its model 26 s);
the cached folder loads in under a second. The conversion says so in one line on stderr; transformers' own
progress bar (a tqdm its GGUF reader opens whatever its progress-bar switch says) is kept off the terminal.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import threading
from pathlib import Path

from timerome.common.files import input_file
from timerome.errors import TimeromeError

# config keys transformers' GGUF reader writes that say nothing about the forward
_DROP = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "unk_token_id",
         "id2label", "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "return_dict",
         "output_attentions", "output_hidden_states", "dtype", "torch_dtype")


def gguf_folder(path: str | Path) -> Path:
    """The cached checkpoint folder of a GGUF file (converted on first use)."""
    from timerome.common.cache import cache_dir, file_sha256, made_once, temp_name

    path = input_file(Path(path).expanduser(), "GGUF file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise TimeromeError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    out = cache_dir() / "gguf" / f"{path.stem}-{file_sha256(path)[:16]}"

    def converted() -> Path:
        tmp = temp_name(out)  # converted aside, renamed into place: a reader never sees half a folder
        tmp.mkdir(parents=True)
        try:
            _convert(path, tmp, out.parent)
            try:
                tmp.rename(out)
            except OSError:  # another process put it there first (where nothing could be locked)
                if not (out / "model.safetensors").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out

    # one process converts, another waits for it
    return made_once(out, f"the conversion of {path.name}",
                     lambda: out if (out / "config.json").is_file() and (out / "model.safetensors").is_file() else None,
                     converted)


def _convert(path: Path, out: Path, cache: Path) -> None:
    import importlib.util

    from timerome.common.progress import hf_bars_off, notify

    if importlib.util.find_spec("gguf") is None:
        raise TimeromeError(f"reading {path.name} needs the `gguf` package: pip install gguf")
    notify(f"converting {path.name} to a checkpoint in the cache ({cache}), once: later loads read it")
    import transformers
    from safetensors.torch import save_file
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with _quiet_gguf_reader(), hf_bars_off():
            tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # noqa: BLE001 - an architecture transformers cannot read from GGUF, a broken file
        raise TimeromeError(f"transformers could not read {path.name} as a causal LM ({type(e).__name__}: "
                            f"{str(e)[:200]})") from None
    finally:
        hf_logging.set_verbosity(level)
    config = {k: v for k, v in model.config.to_dict().items() if k not in _DROP}
    config["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tied = bool(config.get("tie_word_embeddings"))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}  # a tied head is the embedding (safetensors refuses shared storage)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt", "source": path.name})
    tok.save_pretrained(str(out))


_READER_LOCK = threading.Lock()


@contextlib.contextmanager
def _quiet_gguf_reader():
    """transformers' GGUF reader opens a tqdm whatever transformers' progress-bar switch says: while a
    file is read, that module's tqdm shows nothing (everything else on stderr still shows). Under a
    lock, so that two threads converting at once give the module its own tqdm back."""
    try:
        from transformers import modeling_gguf_pytorch_utils as reader
    except ImportError:  # another transformers layout: its bar, if any, shows
        reader = None
    bar = getattr(reader, "tqdm", None)
    with _READER_LOCK:
        if bar is not None:
            reader.tqdm = functools.partial(bar, disable=True)
        try:
            yield
        finally:
            if bar is not None:
                reader.tqdm = bar
