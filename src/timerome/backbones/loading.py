"""load_backbone: a local checkpoint directory (Hugging Face layout) or a GGUF file -> Backbone."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch

from timerome.backbones.backbone import Backbone
from timerome.backbones.detect import detect_family
from timerome.backbones.families import Family
from timerome.backbones.flags import RefusedConfig, check_config, check_values, parameter_count, transformers_refusal
from timerome.backbones.llada_model import model_class
from timerome.backbones.tokenizer import load_tokenizer
from timerome.common.checks import memory_budget
from timerome.common.files import flag_word, read_json, safetensors_error
from timerome.common.progress import hf_bars_off, notify
from timerome.errors import TimeromeError

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "default-model"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def model_place(model: str | Path | None) -> str:
    """A model as a place to compare or record: the embedded model's folder for None, a folder's
    resolved path, else the Hub id as given (two names of one model give one place)."""
    path = DEFAULT_MODEL_DIR if model is None else Path(model)
    return str(path.resolve()) if path.exists() else str(model)


def resolve_checkpoint(path_or_hub_id: str | Path | None) -> Path:
    if isinstance(path_or_hub_id, str) and not path_or_hub_id.strip():  # as the command line's -m "" (an unset variable)
        raise TimeromeError("the model is empty: give a checkpoint folder, a .gguf file or a Hub id, or None (left "
                            "out) for the embedded default")
    if path_or_hub_id in (None, "default", "embedded"):
        if not (DEFAULT_MODEL_DIR / "config.json").exists():
            raise TimeromeError(
                f"the embedded default model is missing from {DEFAULT_MODEL_DIR}; "
                "rebuild it with `timerome build-default`")
        return DEFAULT_MODEL_DIR
    if not isinstance(path_or_hub_id, (str, os.PathLike)):
        raise TimeromeError(f"the model must be a checkpoint folder or a .gguf file (a path), or None for the "
                            f"embedded default; got {type(path_or_hub_id).__name__} {path_or_hub_id!r:.40}")
    p = Path(path_or_hub_id).expanduser()
    if p.is_file() and p.suffix.lower() == ".gguf":
        from timerome.backbones.gguf import gguf_folder

        return gguf_folder(p)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise TimeromeError(f"{p} has no config.json: not a Hugging Face checkpoint directory")
        return p
    if p.exists():
        raise TimeromeError(f"{p} is a file; pass the checkpoint directory that holds config.json (or a .gguf file)")
    text = str(path_or_hub_id)
    if (not isinstance(path_or_hub_id, str) or p.suffix.lower() == ".gguf" or text.startswith(("/", ".", "~"))
            or text.count("/") > 1 or "\\" in text):  # a path, never a Hub id
        raise TimeromeError(f"{text} does not exist: pass a checkpoint folder (with config.json) or a .gguf file")
    hint = flag_word(text)
    if hint:  # `info --json true`: no Hub id either
        raise TimeromeError(f"no checkpoint {text}{hint}")
    # a Hub id ("owner/name"): only what is already in the local cache, or a download when online
    try:
        from huggingface_hub import snapshot_download

        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        return Path(snapshot_download(str(path_or_hub_id), local_files_only=offline))
    except Exception as e:  # noqa: BLE001 - any hub failure becomes one clear message
        raise TimeromeError(
            f"{path_or_hub_id!r} is not a local directory and could not be fetched from the Hub "
            f"({type(e).__name__}); download the checkpoint and pass its directory") from None


def causal_family(path_or_hub_id, family: str | None = None) -> Family | None:
    """The family of a model that is, before any weight loads, certainly autoregressive: a local checkpoint (a
    folder, or a .gguf file: converted now, once, as the load would) whose config.json detects as a causal family
    (`family` where the load is given one: --family, load_backbone's family=) and which declares no mask token
    anywhere (no masked diffusion family loads without one, whatever --family says). None where unsure (a Hub
    id, a family that does not fit the config, included): the loaded model, or the load's own refusal, then
    decides."""
    if path_or_hub_id in (None, "", "default", "embedded") or not isinstance(path_or_hub_id, (str, os.PathLike)):
        return None
    try:
        p = Path(path_or_hub_id).expanduser()
        if not (p.is_dir() or (p.is_file() and p.suffix.lower() == ".gguf")):
            return None
        p = resolve_checkpoint(p)
        config = read_config(p)
        if config.get("mask_token_id") is not None:
            return None
        tokenizer = load_tokenizer(p, config, False)[0]
        if getattr(tokenizer, "mask_token_id", None) is not None:
            return None
        found = detect_family(config, family, mask_declared=lambda: False)[0]
        return found if found.causal else None
    except Exception:  # noqa: BLE001 - any doubt: the load says what is wrong, and the model decides
        return None


def surely_causal(path_or_hub_id, family: str | None = None) -> bool:
    """Whether the model is, before any weight loads, certainly autoregressive (`causal_family`)."""
    return causal_family(path_or_hub_id, family) is not None


def load_backbone(path_or_hub_id: str | Path | None = None, family: str | None = None, *,
                  dtype: str | torch.dtype | None = None, device: str | torch.device = "cpu",
                  trust_remote_code: bool = False) -> Backbone:
    """Load a masked diffusion LM (or an autoregressive LM: a causal family) and wrap it as a Backbone.

    path_or_hub_id: checkpoint directory (config.json + safetensors + tokenizer) or a .gguf file
    (dequantised once, cached: `backbones.gguf`); None or "default" loads the embedded model.
    family: one of timerome.backbones.FAMILIES, else
    detected from config.json's keys and architectures (a family that does not fit the config
    is an error). Config flags our implementation does not implement are refused, unknown keys
    warned about. Remote code runs only with trust_remote_code=True.
    """
    device = _device(device)
    ckpt = resolve_checkpoint(path_or_hub_id)
    config = read_config(ckpt)
    tok_loaded = []

    def tokenizer_once():
        if not tok_loaded:
            tok_loaded.append(load_tokenizer(ckpt, config, trust_remote_code))
        return tok_loaded[0]

    # a Llama config is DiffuLLaMA's or an AR Llama's: the mask token tells (asked only then)
    fam, evidence = detect_family(config, family, mask_declared=lambda: config.get("mask_token_id") is not None or
                                  getattr(tokenizer_once()[0], "mask_token_id", None) is not None)
    torch_dtype = _dtype(dtype)
    check_values(fam.config_spec, config, str(ckpt / "config.json"))
    n_params = parameter_count(fam.config_spec, config)
    n_bytes = n_params * torch.tensor([], dtype=torch_dtype).element_size()
    what = f"{ckpt / 'config.json'} describes a model of about {n_params:.3g} parameters"
    memory_budget(what, n_bytes, "cpu")
    if device.type != "cpu":
        memory_budget(what, n_bytes, device)
    remote = bool(trust_remote_code and fam.needs_remote_code)
    flags = {"refused": [], "unknown": [], "implemented": []}
    if not remote:  # the official code, when it runs, reads its own flags
        flags = check_config(fam.config_spec, config)
        if flags["refused"]:
            raise RefusedConfig(flags["refused"], {"family": fam.name, "evidence": evidence, "checkpoint": str(ckpt)})
    tokenizer, tok_info = tokenizer_once()
    if trust_remote_code and not remote and not tok_info["remote_code"]:  # said, not dropped without a word
        notify(f"trust_remote_code (--trust-remote-code) changes nothing for "
               f"{'the embedded default' if ckpt == DEFAULT_MODEL_DIR else ckpt.name}: neither the {fam.name} "
               f"family nor its tokenizer has remote code; {'timerome' if fam.loader == 'timerome' else 'transformers'}"
               "'s own implementation runs")
    # before the weights: a checkpoint without a usable mask token fails in seconds, not minutes
    rows = config.get("embedding_size") or config.get("vocab_size")  # check_values: an integer >= 1, or absent
    if rows and len(tokenizer) > rows:  # fewer is normal: a vocabulary padded to a round number of rows
        raise TimeromeError(f"the tokenizer has {len(tokenizer)} tokens, the model's embedding {rows} "
                            f"({ckpt / 'config.json'}): its ids past {rows - 1} have no embedding; the tokenizer "
                            "files belong to another model")
    mask_id = _mask_id(config, tokenizer, fam, ckpt)
    if mask_id >= int(rows or mask_id + 1):
        raise TimeromeError(f"mask token id {mask_id} is outside the vocabulary of {ckpt}")
    if remote:
        model = _remote_model(ckpt, fam, torch_dtype)
    elif fam.loader == "timerome":
        model = _our_model(ckpt, config, fam, torch_dtype)
    else:
        model = _transformers_model(ckpt, config, fam, torch_dtype)
    implementation = _implementation(model, fam, remote)
    # hashed where the loader put the weights, before they move: no copy back from a device, and a
    # damaged checkpoint is refused before it is sent there
    fingerprint = verified_weights(model, config, ckpt, implementation=implementation, remote=remote)
    model.to(device)
    embedded = ckpt.resolve() == DEFAULT_MODEL_DIR
    name = "timerome-default" if embedded else ckpt.name
    if str(path_or_hub_id).lower().endswith(".gguf"):  # the cached folder's name carries a digest
        name = Path(str(path_or_hub_id)).stem
    info = {"checkpoint": str(ckpt), "evidence": evidence, "tokenizer": tok_info, "config_keys": flags,
            "implementation": implementation}
    bb = Backbone(model, tokenizer, fam, config, mask_id=mask_id, name=name, remote=remote, info=info,
                  embedded=embedded)
    bb.know_fingerprint(fingerprint)  # the same bytes wherever they are
    return bb


def checkpoint_files(ckpt: Path) -> list[tuple]:
    """(path, size, modification time, inode) of a checkpoint's files (config, weights, code; the file
    itself for a GGUF): what changes when its weights do, read without loading them."""
    ckpt = Path(ckpt)
    files = [ckpt] if ckpt.is_file() else sorted(
        p for p in ckpt.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors", ".py"))
    stats = []
    for p in files:
        st = p.stat()
        stats.append((str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino))
    return stats


def verified_weights(model, config: dict, ckpt: Path, *, implementation: str, remote: bool) -> str:
    """The fingerprint of a freshly loaded model, its weights checked finite (a NaN or inf weight, or
    one a cast to float16 overflowed, is refused by name). Both come from one pass over every byte
    (`weights_digest`), cached in <cache>/fingerprints by the checkpoint's files (path, size,
    modification time), the dtype and the implementation: a second load of the same files costs
    nothing. A cache that cannot be written only costs the pass next time."""
    from timerome.backbones.backbone import FINGERPRINT_VERSION, weights_digest
    from timerome.common.cache import cache_dir, digest, write_json

    dtype = next(model.parameters()).dtype

    key = dict(kind="weights", v=FINGERPRINT_VERSION, files=checkpoint_files(ckpt), dtype=str(dtype),
               implementation=implementation, remote=remote)
    entry = cache_dir() / "fingerprints" / f"{digest(key)}.json"
    found = None
    try:
        found = json.loads(entry.read_text(encoding="utf-8"))
        found = (str(found["fingerprint"]), [str(n) for n in found["nonfinite"]])
    except (OSError, ValueError, KeyError, TypeError):
        found = None
    if found is None:
        found = weights_digest(model, config)
        try:
            write_json(entry, dict(fingerprint=found[0], nonfinite=found[1], checkpoint=str(ckpt), dtype=str(dtype)))
        except (TimeromeError, OSError):  # an unwritable cache (write_atomic's words for an OSError, or one
            pass                          # raised while it finds them): computed again next time
    fingerprint, nonfinite = found
    if nonfinite:
        raise TimeromeError(f"the weights of {ckpt} hold NaN or infinite values ({len(nonfinite)} of its tensors: "
                            f"{', '.join(nonfinite[:3])}{', ...' if len(nonfinite) > 3 else ''})"
                            + (f" once cast to {str(dtype).removeprefix('torch.')}" if dtype != torch.float32
                               else "") + ": every output would be NaN; use an undamaged checkpoint")
    return fingerprint


def read_config(ckpt: Path) -> dict:
    config = read_json(ckpt / "config.json", "the checkpoint's config", keys_once=False)  # as transformers reads it
    if not isinstance(config, dict):
        raise TimeromeError(f"{ckpt / 'config.json'} is not a JSON object")
    return config


def _implementation(model, fam: Family, remote: bool) -> str:
    kind = "the checkpoint's own code (trust_remote_code)" if remote else (
        "timerome's implementation" if fam.loader == "timerome" else "transformers")
    return f"{type(model).__name__} ({kind})"


RUNS_ON = ("cpu", "cuda", "mps")  # the device types timerome computes on; "meta" loads (shapes only, for tests)


def _device(device) -> torch.device:
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise TimeromeError(f"unknown device {device!r}; use cpu, cuda, cuda:N or mps") from None
    if d.type not in RUNS_ON + ("meta",):  # xla, xpu, ...: torch names them, timerome does not run there
        raise TimeromeError(f"device {device!r}: timerome runs on cpu, cuda, cuda:N or mps, not {d.type}")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise TimeromeError(f"device {device!r}: CUDA is not available on this machine")
    if d.type == "cuda" and d.index is not None and d.index >= torch.cuda.device_count():
        raise TimeromeError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if d.type == "mps" and not torch.backends.mps.is_available():
        raise TimeromeError(f"device {device!r}: MPS is not available on this machine")
    return d


def _dtype(dtype) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:  # an integer dtype would fail inside torch's Module.to
            raise TimeromeError(f"dtype {dtype} is not a floating-point type a model computes in; use one of "
                                f"{', '.join(DTYPES)}")
        return dtype
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise TimeromeError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _mask_id(config: dict, tokenizer, fam: Family, ckpt: Path | None = None) -> int:
    declared, token = config.get("mask_token_id"), getattr(tokenizer, "mask_token_id", None)
    if declared is not None and token is not None and int(declared) != int(token):
        # which one the model was trained with is a guess: refused, not settled silently for config.json
        raise TimeromeError(f"{ckpt / 'config.json' if ckpt else 'config.json'} says mask_token_id {declared}, but "
                            f"the tokenizer's mask token {str(tokenizer.mask_token)!r} is id {token}: the two must "
                            "agree (remove mask_token_id from config.json, or fix it)")
    for candidate in (config.get("mask_token_id"), getattr(tokenizer, "mask_token_id", None), fam.mask_id):
        if candidate is not None:
            return int(candidate)
    if fam.causal:
        # no mask token: a placeholder for positions not yet decoded, which a causal forward never
        # reads when it predicts them (the pad / eos token, else 0)
        return placeholder_id(config, tokenizer)
    raise TimeromeError(
        "this checkpoint has no mask token: neither config.json (mask_token_id), the tokenizer, "
        f"nor the {fam.name} family names one; an MDLM needs one")


def placeholder_id(config: dict, tokenizer) -> int:
    """A causal model's stand-in for the mask id: its pad token, else eos, else 0."""
    for candidate in (getattr(tokenizer, "pad_token_id", None), config.get("pad_token_id"),
                      getattr(tokenizer, "eos_token_id", None), config.get("eos_token_id")):
        if isinstance(candidate, int):
            return candidate
    return 0


def _state_dict(ckpt: Path) -> dict[str, torch.Tensor]:
    state = {}
    for path in weight_files(ckpt):  # no tensor in two files (weight_files refuses that): the order is moot
        state.update(_load_weights(path))
    return state


def weight_files(ckpt: Path) -> dict[Path, list[str]]:
    """The safetensors files of a checkpoint, each with the tensor names its header lists (no tensor read):
    model.safetensors, else the shards of model.safetensors.index.json, checked against the index. A shard
    the index names but the folder lacks, a tensor two shards hold, a tensor the index puts in a shard that
    does not hold it: refused by name, for every loader."""
    single = ckpt / "model.safetensors"
    if single.exists():
        return {single: _tensor_names(single)}
    index = ckpt / "model.safetensors.index.json"
    if not index.exists():
        raise no_safetensors(ckpt)
    doc = read_json(index, "the checkpoint's weight index", keys_once=False)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise TimeromeError(f"{index} has no weight_map object (tensor name -> shard file name): not a "
                            "safetensors index")
    files = {}
    for name in sorted(set(weight_map.values())):
        if Path(name).name != name or name in (".", "..") or not (ckpt / name).is_file():
            raise TimeromeError(f"{index} names the shard {name}, which is missing from {ckpt}")
        files[ckpt / name] = _tensor_names(ckpt / name)
    holder: dict[str, Path] = {}
    for path, names in files.items():
        for t in names:
            if t in holder:
                raise TimeromeError(f"the tensor {t} is in two shards of {ckpt}, {holder[t].name} and {path.name}: "
                                    "which one the model would get is a guess; a checkpoint holds each tensor once")
            holder[t] = path
    for t, name in weight_map.items():
        if holder.get(t) != ckpt / name:
            raise TimeromeError(f"{index} puts the tensor {t} in {name}, which does not hold it"
                                + (f" ({holder[t].name} does)" if t in holder else "")
                                + ": the index does not match its shards")
    # a tensor a shard holds that the index does not list is read all the same (the structure's own check
    # then refuses one it has no place for): transformers reads by the index, and real indexes are written from
    # their shards, so refusing it would only stop a checkpoint whose numbers are not in doubt
    return files


def _tensor_names(path: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except Exception as e:  # noqa: BLE001 - safetensors raises SafetensorError, OSError, ValueError...
        raise safetensors_error(path, e) from None


def misfit(ckpt: Path, fam: Family, missing, unexpected=(), mismatched=()) -> TimeromeError | None:
    """One line on how a checkpoint's weights differ from the structure its config.json describes (None when
    they do not): the first tensor of each kind by name, and how many more. mismatched: (name, shape in the
    checkpoint, shape the structure needs)."""
    def first(names, what):
        names = sorted(names, key=_natural)
        more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
        return f"{names[0]} {what}{more}" if names else ""

    mismatched = sorted(mismatched, key=lambda m: _natural(m[0]))
    shapes = (f"{mismatched[0][0]} has shape {list(mismatched[0][1])} where the structure needs "
              f"{list(mismatched[0][2])}" + (f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else "")
              ) if mismatched else ""
    parts = [p for p in (first(missing, "is missing"), first(unexpected, "is not part of it"), shapes) if p]
    if not parts:
        return None
    return TimeromeError(f"weights in {ckpt} do not fit the {fam.name} structure: {'; '.join(parts)}")


def _natural(name: str) -> tuple:
    """layers.2 before layers.10."""
    import re

    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"(\d+)", name) if x)


def no_safetensors(ckpt: Path) -> TimeromeError:
    """A checkpoint with no safetensors weights: refused, whatever else it holds and whoever's code would load it."""
    return TimeromeError(f"{ckpt} has no model.safetensors (pickled .bin weights are not loaded)")


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises SafetensorError, OSError, ValueError...
        raise safetensors_error(path, e) from None


def _our_model(ckpt: Path, config: dict, fam: Family, dtype: torch.dtype):
    cls = model_class(config)
    with torch.device("meta"):
        model = cls(config)
    state = _state_dict(ckpt)
    ints = [k for k, v in state.items() if not v.is_floating_point()]
    if ints:
        more = " and more" if len(ints) > 1 else ""
        raise TimeromeError(f"weights in {ckpt} are not floating point ({ints[0]} is "
                            f"{str(state[ints[0]].dtype).removeprefix('torch.')}{more}): was the checkpoint "
                            "converted? use the original weights")
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = misfit(ckpt, fam, [k for k in want if k not in state], [k for k in state if k not in want],
                   [(k, tuple(v.shape), want[k]) for k, v in state.items() if k in want and tuple(v.shape) != want[k]])
    if wrong:
        raise wrong
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise TimeromeError(f"weights in {ckpt} do not fit the {fam.name} structure: {str(e)[:400]}") from None
    return model.to(dtype)


def _transformers_model(ckpt: Path, config: dict, fam: Family, dtype: torch.dtype):
    import transformers

    cfg_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                          # Dream checkpoints are Qwen2 weights under their own model_type
                          "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                          "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel)}[fam.hf_class]
    fields = {k: v for k, v in config.items()
              if k not in ("model_type", "architectures", "auto_map") and not (k == "rope_scaling" and v is None)}
    where = ckpt / "config.json"
    try:
        hf_config = cfg_cls(**fields)
    except Exception as e:  # noqa: BLE001 - transformers' own validation of a field, named with the file
        raise transformers_refusal(where, e, config, f"transformers' {cfg_cls.__name__}") from None
    weight_files(ckpt)  # the index and its shards, checked as for timerome's own loader
    try:
        with hf_bars_off(), _load_report_off():
            # from_pretrained with an explicit config: the checkpoint's own model_type (e.g. "Dream")
            # is not needed, so no remote code runs. Mismatched shapes are reported (and refused below)
            # rather than raised, and loading_info says what was missing or left over
            model, info = model_cls.from_pretrained(
                str(ckpt), config=hf_config, attn_implementation=fam.hf_attention, use_safetensors=True,
                output_loading_info=True, ignore_mismatched_sizes=True, **_dtype_kwarg(dtype))
    except Exception as e:  # noqa: BLE001
        try:  # a config transformers cannot build a model from is config.json's fault, not the weights'
            with torch.device("meta"):
                model_cls(hf_config)
        except Exception as built:  # noqa: BLE001
            raise TimeromeError(f"{where}: transformers' {model_cls.__name__} cannot be built from it "
                                f"({type(built).__name__}: {' '.join(str(built).split())[:300]})") from None
        raise TimeromeError(f"weights in {ckpt} do not fit the {fam.name} structure: "
                            f"{' '.join(str(e).split())[:400]}") from None
    # weights the checkpoint lacks were filled randomly, ones the structure lacks dropped, misshapen ones
    # re-initialised: refused, as timerome's own loader refuses them (tied weights are not reported missing)
    wrong = misfit(ckpt, fam, info.get("missing_keys") or (), info.get("unexpected_keys") or (),
                   info.get("mismatched_keys") or ())
    if wrong:
        raise wrong
    if info.get("error_msgs"):
        raise TimeromeError(f"weights in {ckpt} do not fit the {fam.name} structure: "
                            f"{' '.join(str(info['error_msgs'][0]).split())[:400]}")
    return model


REPORT_MARKS = ("LOAD REPORT", "were not initialized from the model checkpoint",
                "were not used when initializing")  # transformers 5.x's, 4.x's two


@contextlib.contextmanager
def _load_report_off():
    """transformers' report of missing / unexpected / mismatched weights off for the block (5.x: its "LOAD
    REPORT" table; 4.x: its "Some weights of ... were not initialized / were not used" paragraphs): the load
    refuses those by name in one line instead. Its other warnings stay."""
    import logging

    class Report(logging.Filter):
        def filter(self, record):
            return not any(m in str(record.getMessage()) for m in REPORT_MARKS)

    log, quiet = logging.getLogger("transformers.modeling_utils"), Report()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


def _dtype_kwarg(dtype: torch.dtype) -> dict:
    # transformers 5 renamed torch_dtype to dtype; remote code of some MDLMs still needs 4.x
    import transformers

    return {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": dtype}


def _remote_model(ckpt: Path, fam: Family, dtype: torch.dtype):
    from transformers import AutoModel

    if not any((ckpt / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json")):
        raise no_safetensors(ckpt)  # the user trusts the code, not pickled .bin weights
    weight_files(ckpt)  # the index and its shards agree, as for the other loaders
    try:
        with hf_bars_off(), _load_report_off():  # its "Loading checkpoint shards" bar and its report: off
            model, info = AutoModel.from_pretrained(str(ckpt), trust_remote_code=True, use_safetensors=True,
                                                    output_loading_info=True, **_dtype_kwarg(dtype))
    except Exception as e:  # noqa: BLE001
        raise TimeromeError(f"loading {ckpt} with its remote code failed: {e}") from None
    # what the code's structure needs and the checkpoint lacks was filled randomly (review 88: the other
    # loaders refused it, this one did not): refused by name, as they refuse it
    wrong = misfit(ckpt, fam, info.get("missing_keys") or (), info.get("unexpected_keys") or (),
                   info.get("mismatched_keys") or ())
    if wrong:
        raise wrong
    return model
