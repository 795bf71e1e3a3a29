"""lm-evaluation-harness for masked diffusion LMs: the model class `timerome`, with or without an edit.

    python -m timerome.integrations.lm_eval_model --model timerome --device cpu \
        --model_args pretrained=DIR,edit=MEMORY.safetensors,n_mc=16,seed=0 --tasks arc_easy      # any lm-eval 0.4
    lm_eval --model timerome --model_args ... --tasks ...    # only an lm-eval that discovers model plugins

The first form is lm-eval's own command line after this module registers the model: it works with every
lm-eval 0.4, 0.4.13 included. Plain `lm_eval --model timerome` works only with an lm-eval that reads the
`lm_eval.models` entry point (Registration, below); 0.4.13 answers that it knows no model "timerome".

lm-eval has no masked-diffusion model; LLaDA's repository registers one whose loglikelihood is the
Monte-Carlo masked estimator and whose generate_until is the denoising sampler. This is ours:
- loglikelihood: `likelihood.log_likelihood_batch` (MDLM ELBO, nats, n_mc masked rows) of the
  continuation given the context, split as lm-eval's own models split it (trailing spaces of the
  context move to the continuation; the continuation is what encoding the whole text adds after the
  context's tokens; both begin with the model's sequence start, `Backbone.prompt_start`, as lm-eval's
  HF models keep the tokenizer's own special tokens; a context too long for the model loses its
  oldest tokens after that start, as lm-eval's HF models cut it). Each request draws its masks from a generator seeded by (seed, context,
  continuation) only (`pair_seed`), so a request's score depends on nothing else in the run and two
  operating points of one model see the same masks (paired). is_greedy (lambada-style accuracy):
  the sampler fills the continuation one token per step at temperature 0 and must reproduce it
  (`check_greedy=false` skips this and answers False, as LLaDA's default: then the acc of a
  loglikelihood task such as lambada reads 0 whatever the model knows; `evaluate_tasks` refuses that
  combination, lm-eval's command line cannot see it).
- loglikelihood_rolling: lm-eval's disjoint rolling windows, each scored as above (a sum of ELBOs:
  a lower bound on log p, like every MDLM likelihood here); the first window conditions on what
  an empty context is, as loglikelihood("", text) does (`context_start`: the sequence start; an
  autoregressive model's BOS, as lm-eval's HF models prefix it), and a window's context and
  targets fit the model's context together (one forward reads both).
- generate_until: `sampler.generate` (low-confidence remasking; temperature from the task), the
  answer ends at its first special token (end-of-text: an MDLM fills the rest of its budget with it;
  cut on token ids, as `sampler.continuations` cuts, since a decoded id leaves a space before it) and
  at the first of the task's stop sequences (`until`); the token budget under any of lm-eval's names
  (`MAX_TOKENS`), other settings the sampler has no use for named in a warning; a context cut to fit the
  model is counted (`get_model_info`); `cache=prefix|dual`,
  `threshold=` and `refresh_every=` switch on the sampler's fast options (docs/fast-sampling.md;
  default: the exact sampler). The is_greedy check always uses the exact sampler.
- an edit, active during every call: `edit=FILE.safetensors` (an EditMemory, `alpha=` / `q=` may
  override its operating point; a CodebookMemory, `alpha=` / `margin=` / `inner=`), or
  `method=NAME` plus that method's options (installed by the
  method registry on the forget task `forget=` of `data=`), or `installed=` an Edit object (Python).

Registration: importing this module registers the class as "timerome" in lm-eval's model registry,
and the package declares the `lm_eval.models` entry point that newer lm-eval releases discover by
themselves. lm-eval 0.4.13 and older never read entry points: run `python -m timerome.integrations.lm_eval_model`
(lm-eval's own command line, after this import), or pass `TimeromeLM(...)` to `lm_eval.simple_evaluate`.
lm-eval's --batch_size is accepted and not used: rows are packed into forwards of `max_tokens`.

Seeds: `seed=` in model_args (0) seeds every request's masks and sampling noise (`pair_seed`).
lm-eval's own --seed seeds its few-shot sampling and the global random generators, which no generator
here reads: it leaves timerome's masks and samples as they were (a zero-shot task scores the same).
lm-eval 0.4.13 passes the model no seed (only batch_size, max_batch_size and device), so give both to
vary a run, e.g. `--seed 1 --model_args seed=1,...`; `evaluate_tasks(seed=)` passes one seed to both.
Model args are checked: steps, gen_length and block_length are integers >= 1 (or none: from the task's
max_gen_toks), check_greedy and trust_remote_code are true/false/yes/no/1/0.
"""

from __future__ import annotations

import json
import numbers
import re
import sys
import warnings
from contextlib import contextmanager

import torch

from timerome.backbones import load_backbone
from timerome.common.cache import digest
from timerome.common.checks import integer, number, repeated, shown
from timerome.common.checks import seed as check_seed
from timerome.common.progress import progress_bar
from timerome.data.task import forget_task
from timerome.engine.encoding import fit
from timerome.engine.hooks import TraceState, check_stepless, edit_active
from timerome.engine.likelihood import log_likelihood_batch
from timerome.engine.sampler import (check_fast_options, check_options, cut_at, generate, refuse_diffusion_options,
                                     until_special)
from timerome.engine.settings import LIKELIHOOD, SAMPLER
from timerome.errors import TimeromeError
from timerome.memory.memory_file import load_memory
from timerome.methods import InferenceEdit, install

try:  # optional: pip install timerome[eval]
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError:
    LM, register_model = object, None

NAME = "timerome"
# TimeromeLM's settings of generate_until alone, and those every request reads (its likelihood's batch, the context
# it cuts to): what the utility experiment's `generation` setting may pass
GENERATION_OPTIONS = ("steps", "gen_length", "block_length", "remasking", "cfg_scale", "cache", "threshold",
                      "refresh_every")
REQUEST_OPTIONS = ("mc_batch", "max_tokens")
# a request's gen_kwargs: the token budget's names, first wins (lm-eval's normalize_gen_kwargs order), those
# generate_until reads, and the values of others that ask for nothing the sampler lacks
MAX_TOKENS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
READ_GEN_KWARGS = {"until", "do_sample", "temperature", *MAX_TOKENS}
NEUTRAL_GEN_KWARGS = {"num_beams": 1, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0}
INSTALL_HINT = "lm-evaluation-harness is not installed: pip install 'timerome[eval]'"
# how lm-eval users write a yes / no model_arg (lm-eval turns true / false into bools and 1 / 0 into ints itself)
YES, NO = ("true", "yes", "1"), ("false", "no", "0")


def flag(value, what: str) -> bool:
    """A yes / no model_arg: a bool, 1 / 0, or true / false / yes / no / 1 / 0 in any case; anything else is
    refused (bool("no") is True, and "flase" would have been too)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    word = value.strip().lower() if isinstance(value, str) else None
    if word in YES + NO:
        return word in YES
    raise TimeromeError(f"model_args {what} must be true or false (or yes / no, 1 / 0), got {shown(value)}")


def pair_seed(seed: int, context: str, continuation: str) -> int:
    """The seed of one request's Monte-Carlo masks (or sampling noise): a function of its text only."""
    return int(digest([int(seed), context, continuation], 15), 16)


def check_schedule(steps, gen_length, block_length, remasking=SAMPLER.remasking, cfg_scale=SAMPLER.cfg_scale,
                   where: str = "model_args") -> None:
    """generate_until's sampler settings (integers >= 1 or None, checked before), as `sampler.check_options` checks
    them, where they are given: gen_length None is each task's length, one block, so a block_length without it
    is refused (a task's length need not be a multiple of it). where: how the message names them."""
    if block_length is not None and gen_length is None:
        raise TimeromeError(f"{where} block_length={block_length} without gen_length: each task gives the answer's "
                            "length (its max_gen_toks), which block_length need not divide; give gen_length too (a "
                            "multiple of it), or leave block_length out (one block per answer)")
    n = gen_length or 1  # none: the task's length in one block, whatever steps
    try:
        check_options(steps or n, n, block_length or n, cfg_scale=cfg_scale, remasking=remasking)
    except TimeromeError as e:  # named as model_args / the setting name them, not as the CLI's --options
        raise TimeromeError(f"{where}: " + re.sub(r" \(--[a-z-]+\)", "", str(e))) from None


def context_start(backbone) -> list[int]:
    """What an empty context is: the sequence start (`Backbone.prompt_start`); for an autoregressive model
    without one, its BOS (else EOS) token, as lm-eval's HF models prefix it (every token is read from
    those before it); for an MDLM without one, nothing (it reads the continuation unconditionally)."""
    if backbone.prompt_start or not getattr(backbone, "causal", False):
        return list(backbone.prompt_start)
    tok = backbone.tokenizer
    first = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if first is None:
        raise TimeromeError(f"{backbone.name} is autoregressive and its tokenizer has no BOS or EOS token to begin "
                            "an empty context with")
    return [int(first)]


def split_request(backbone, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's own models split a request (module docstring)."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    ctx = backbone.encode_prompt(context) if context else context_start(backbone)
    whole = backbone.encode_prompt(context + continuation)
    if whole[:len(ctx)] == ctx:
        return ctx, whole[len(ctx):]
    return ctx, backbone.encode(continuation)  # the tokeniser merged across the boundary: keep the context


class TimeromeLM(LM):
    """lm-eval's LM over a timerome Backbone, with an optional edit active (module docstring)."""

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """--model_args as lm-eval's older command line hands it over (a string): `create_from_arg_obj`."""
        from lm_eval import utils

        keys = [part.split("=", 1)[0].strip() for part in (arg_string or "").split(",") if part.strip()]
        twice = repeated(keys)
        if twice:  # the parser keeps the last value without a word
            raise TimeromeError(f"--model_args gives {twice[0]} twice: give each setting once")
        return cls.create_from_arg_obj(utils.simple_parse_args_string(arg_string or ""), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm-eval's --model_args beside its own --device / --batch_size (lm-eval 0.4.13's command line comes
        here with a dict): the same setting given both ways with two values is refused in one line (lm-eval's
        own merge raised "got multiple values for keyword argument"); the same value twice is one setting."""
        args = dict(arg_dict or {})
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        both = sorted(k for k in set(args) & set(extra) if str(args[k]) != str(extra[k]))
        if both:
            raise TimeromeError("; ".join(f"{k} given twice: --model_args {k}={args[k]} and --{k} {extra[k]}"
                                          for k in both) + ": give each once")
        return cls(**{**extra, **args})

    def __init__(self, pretrained=None, edit=None, method=None, *, n_mc: int = LIKELIHOOD.n_mc, mc_batch: int = 16,
                 max_tokens: int | None = None, steps=None, gen_length=None, block_length=None,
                 remasking: str = SAMPLER.remasking, cfg_scale: float = SAMPLER.cfg_scale, check_greedy: bool = True,
                 cache=None, threshold=None, refresh_every=None,
                 seed: int = 0, device=None, dtype=None, family=None, trust_remote_code: bool = False,
                 data: str = "embedded", forget: str = "forget01", backbone=None, installed=None,
                 batch_size=None, max_batch_size=None, **options):
        if register_model is None:
            raise TimeromeError(INSTALL_HINT)
        super().__init__()
        if sum(x is not None for x in (edit, method, installed)) > 1:
            raise TimeromeError("give one of edit= (a memory file), method= (a registry method) or installed=")
        unread = [f"{k}={v}" for k, v, default in (("data", data, "embedded"), ("forget", forget, "forget01"))
                  if v != default and method is None]
        if unread:  # they choose the forget set a method= edit is installed on
            raise TimeromeError(f"model_args {', '.join(unread)}: the forget set of method=, which is not given, so "
                                "read by nothing: give method=NAME, or leave them out")
        if threshold is not None and steps is not None:  # as `timerome generate` refuses them
            raise TimeromeError("model_args steps is read by nothing beside threshold: the sampler takes as many steps "
                                "as each block needs; give one of them")
        if device in (None, "auto"):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif str(device).startswith("cuda") and not torch.cuda.is_available():  # lm-eval's default is cuda:0
            raise TimeromeError(f"lm-eval asks for device {device}, but CUDA is not available here: pass --device cpu")
        # the settings a model need not be loaded to check: a bad one stops here, before minutes of loading.
        # steps / gen_length / block_length none: from the task (its max_gen_toks, one token per step, one
        # block); 0 is refused, not taken for none
        steps, gen_length, block_length = (
            integer(v, f"model_args {k}", lo=1, none="or left out")
            for k, v in (("steps", steps), ("gen_length", gen_length), ("block_length", block_length)))
        self.check_greedy = flag(check_greedy, "check_greedy")
        trust_remote_code = flag(trust_remote_code, "trust_remote_code")
        self.backbone = backbone if backbone is not None else load_backbone(
            pretrained, family, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
        self._device = self.backbone.device
        self.n_mc, self.mc_batch = integer(n_mc, "n_mc", lo=1), integer(mc_batch, "mc_batch", lo=1)
        self.seed = check_seed(seed, "seed")
        self.max_tokens = integer(max_tokens, "max_tokens", lo=1, none="or left out")  # None: the device's default
        number(cfg_scale, "cfg_scale", lo=0)
        cache = None if cache in (None, "", "none", "None") else cache
        # an autoregressive model: the diffusion sampler's settings refused here, not at the first generate_until
        refuse_diffusion_options(self.backbone, steps=steps, block_length=block_length, remasking=remasking,
                                 cache=cache, threshold=threshold, refresh_every=refresh_every, cfg_scale=cfg_scale)
        check_fast_options(cache, threshold, refresh_every, remasking)
        if not getattr(self.backbone, "causal", False):  # the sampler's own settings: here, not at the first request
            check_schedule(steps, gen_length, block_length, remasking, cfg_scale, "model_args")
        if cache is not None:
            self.backbone.kv_cache()  # a family without the cache fails here, not mid-task
        self.gen = dict(steps=steps, gen_length=gen_length, block_length=block_length, remasking=remasking,
                        cfg_scale=float(cfg_scale), cache=cache, threshold=threshold, refresh_every=refresh_every)
        self.generated = 0  # generate_until requests answered: the generation settings above are read by these only
        self.warned: set[str] = set()  # the tasks' generation settings named once as read by nothing
        self.cut = {"loglikelihood": 0, "generate_until": 0}  # contexts that lost their oldest tokens to fit
        self.edit, self.edit_info = self._edit(edit, method, installed, data, forget, options)

    # ---------------------------------------------------------------- the edit

    def _edit(self, path, method, installed, data, forget, options):
        bb = self.backbone
        if installed is not None:
            if options:  # an installed edit is built already: its settings are its own
                raise TimeromeError(f"model_args {', '.join(sorted(options))}: an installed edit (installed=) is built "
                                    "already, so an edit's settings are read by nothing; set them when installing it")
            return installed, {"edit": getattr(installed, "method", "installed")}
        if path is not None:
            memory = load_memory(path, bb)
            allowed = set(memory.OVERRIDABLE)
            unknown = sorted(set(options) - allowed)
            if unknown:
                raise TimeromeError(f"unknown model_args {', '.join(unknown)} (with edit= only "
                                    f"{' and '.join(sorted(allowed))} apply to this memory)")
            for k, v in options.items():
                setattr(memory, k, v)
            with memory.applied(bb):  # a bad alpha / q fails here, not in the middle of a task
                pass
            edit = InferenceEdit(method="memory", config=dict(options), context=lambda: memory.applied(bb),
                                 memory=memory)
            return edit, {"edit": str(path), "alpha": memory.alpha, "q": getattr(memory, "q", None), "facts": len(memory),
                          "coordinate": memory.coordinate.as_dict()}
        if method is not None:
            task = forget_task(None if data == "tofu" else data, forget)
            edit = install(method, bb, task, options, self.seed)
            return edit, {"edit": method, "config": edit.config, "install_seconds": edit.install_seconds}
        if options:  # an edit's settings (alpha, q) without an edit, or a misspelt argument: said which
            raise TimeromeError(f"model_args {', '.join(sorted(options))}: no such argument of the model, and an edit's "
                                "settings (e.g. alpha, q) apply only beside edit=MEMORY_FILE or method=NAME")
        return None, {"edit": None}

    def active(self):
        """The edit's hooks for a `with` block (nothing without an edit)."""
        return edit_active(self.edit, self.backbone)

    def get_model_info(self) -> dict:
        return {"timerome_model": self.backbone.name, "fingerprint": self.backbone.fingerprint(),
                "n_mc": self.n_mc, "timerome_contexts_cut": dict(self.cut),
                **{f"timerome_{k}": v for k, v in self.edit_info.items()}}

    def _count_cut(self, kind: str, was_cut: bool) -> None:
        """A context that lost its oldest tokens to fit the model: counted (get_model_info), named once."""
        if was_cut:
            self.cut[kind] += 1
            if self.cut[kind] == 1:
                warnings.warn(f"lm-eval's {kind}: a context longer than the model's {self.backbone.max_length} "
                              "tokens loses its oldest tokens (after the sequence start), as lm-eval's HF models cut "
                              "it; get_model_info()['timerome_contexts_cut'] counts them", stacklevel=3)

    # ---------------------------------------------------------------- likelihood

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        args = [tuple(r.args) for r in requests]
        out = self._score(args, disable_tqdm)
        for a, res in zip(args, out):
            self.cache_hook.add_partial("loglikelihood", a, res)
        return out

    def _score(self, args, disable_tqdm=False) -> list[tuple[float, bool]]:
        greedy = self.check_greedy
        check_stepless(self.edit, "lm-eval's loglikelihood", self.backbone)
        done: dict = {}
        with self.active() as st, progress_bar("lm-eval loglikelihood", len(set(args)),
                                               enabled=not disable_tqdm) as bar:
            state = st if isinstance(st, TraceState) else None
            for context, continuation in args:
                if (context, continuation) in done:
                    continue
                ctx, cont = split_request(self.backbone, context, continuation)
                if len(cont) >= self.backbone.max_length:  # a score of part of it would pass for the whole
                    raise TimeromeError(f"a continuation of {len(cont)} tokens does not fit the model's context of "
                                        f"{self.backbone.max_length} tokens with any context: {continuation[:60]!r}")
                # a long context loses its oldest tokens (after the sequence start), as lm-eval's HF models cut it
                ctx, cont, was_cut = fit(ctx, cont, self.backbone.max_length, len(self.backbone.prompt_start))
                self._count_cut("loglikelihood", was_cut)
                if cont:
                    g = torch.Generator().manual_seed(pair_seed(self.seed, context, continuation))
                    with torch.no_grad():
                        lp = log_likelihood_batch(self.backbone, [ctx], [cont], n_mc=self.n_mc,
                                                  batch_size=self.mc_batch, generator=g, max_tokens=self.max_tokens)
                    done[(context, continuation)] = (float(lp[0]), bool(greedy and self._greedy(ctx, cont, state)))
                else:  # nothing to score: log p = 0, and trivially greedy
                    done[(context, continuation)] = (0.0, True)
                bar.advance()
        return [done[a] for a in args]

    def _greedy(self, ctx: list[int], cont: list[int], state) -> bool:
        """Whether the sampler, one token per step at temperature 0, fills in exactly `cont`."""
        n = len(cont)  # an empty context generates unconditionally (a mask standing in for it took a step)
        x = generate(self.backbone, torch.tensor([ctx], dtype=torch.long).view(1, len(ctx)), steps=n, gen_length=n,
                     block_length=n, state=state)
        return x[0, -n:].tolist() == list(cont)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        bb = self.backbone
        # every window's context and targets are read in one forward, so a window holds at most max_length
        # tokens: the first conditions on what an empty context is (`context_start`, as loglikelihood("", text)),
        # the others on the token before their targets
        start = context_start(bb)
        room = bb.max_length - max(1, len(start))
        check_stepless(self.edit, "lm-eval's loglikelihood_rolling", self.backbone)
        texts = [r.args[0] for r in requests]
        done: dict[str, float] = {}  # a text asked twice is scored once (its windows draw the same masks anyway)
        with self.active(), progress_bar("lm-eval loglikelihood_rolling", len(set(texts)),
                                         enabled=not disable_tqdm) as bar:
            for text in texts:
                if text in done:
                    continue
                windows = [make_disjoint_window(w) for w in get_rolling_token_windows(bb.encode(text), bb.mask_id,
                                                                                      room, 1)]
                if windows:  # the placeholder prefix becomes what an empty context is (`context_start`)
                    windows[0] = (start, windows[0][1])
                total = 0.0
                for c, t in windows:
                    g = torch.Generator().manual_seed(pair_seed(self.seed, json.dumps(c), json.dumps(t)))
                    with torch.no_grad():
                        total += float(log_likelihood_batch(bb, [c], [t], n_mc=self.n_mc, batch_size=self.mc_batch,
                                                            generator=g, max_tokens=self.max_tokens)[0])
                done[text] = total
                self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
                bar.advance()
        return [done[t] for t in texts]

    # ---------------------------------------------------------------- generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        with self.active() as st, progress_bar("lm-eval generate_until", len(requests),
                                               enabled=not disable_tqdm) as bar:
            state = st if isinstance(st, TraceState) else None
            for r in requests:
                context, kwargs = r.args
                text = self._generate(context, dict(kwargs or {}), state)
                out.append(text)
                self.cache_hook.add_partial("generate_until", r.args, text)
                self.generated += 1
                bar.advance()
        return out

    def _task_settings(self, kwargs: dict) -> tuple[list[str], int | None, float]:
        """(until, max_gen_toks or None, temperature) from a request's gen_kwargs, as lm-eval reads them
        (its `normalize_gen_kwargs`: the token budget under any of its names, the first by MAX_TOKENS' order;
        do_sample false is temperature 0). A setting the sampler has no use for (num_beams, top_p, ...) is named
        in a warning, once per name and model, not dropped without a word."""
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        asked = next((kwargs[k] for k in MAX_TOKENS if kwargs.get(k) is not None), None)
        temperature = float(kwargs.get("temperature", SAMPLER.temperature) or 0.0) if kwargs.get("do_sample", True) else 0.0
        unread = sorted(k for k, v in kwargs.items() if k not in READ_GEN_KWARGS and k not in self.warned
                        and NEUTRAL_GEN_KWARGS.get(k, object()) != v and v is not None)
        if unread:
            self.warned.update(unread)
            warnings.warn(f"the task's generation setting {', '.join(f'{k}={kwargs[k]!r}' for k in unread)} is read by "
                          "nothing here: the sampler decodes greedily, or samples at the task's temperature, and "
                          "reads only until, the token budget, do_sample and temperature", stacklevel=3)
        return until, asked, temperature

    def _generate(self, context: str, kwargs: dict, state) -> str:
        bb = self.backbone
        until, asked, temperature = self._task_settings(kwargs)
        # the task's token budget (lm-eval's own default, 256, where it gives none) unless gen_length overrides it
        length = self.gen["gen_length"] or integer(256 if asked is None else asked, "the task's max_gen_toks", lo=1)
        if self.gen["gen_length"] and asked is not None and length > asked and "gen_length" not in self.warned:
            self.warned.add("gen_length")  # documented; said at run time too, once: a task's limit is part of its score
            warnings.warn(f"model_args gen_length {length} exceeds a task's budget of {asked} tokens: its answers may "
                          "run past the task's limit (cut only at its stop sequences); leave gen_length out to use "
                          "each task's own", stacklevel=3)
        steps, block = self.gen["steps"] or length, self.gen["block_length"] or length
        room = bb.max_length - length
        if room < 1:
            raise TimeromeError(f"gen_length {length} leaves no room for a prompt in the model's context of "
                                f"{bb.max_length} tokens: pass a smaller gen_length")
        # the most recent context, as lm-eval's models keep, after the sequence start (none: unconditional)
        prompt, _, was_cut = fit(bb.encode_prompt(context) if context.strip() else context_start(bb), [0] * length,
                                 bb.max_length, len(bb.prompt_start))
        self._count_cut("generate_until", was_cut)
        rest = {k: v for k, v in kwargs.items() if k != "until"}  # the request's draws: its context and settings
        g = torch.Generator(device=bb.device).manual_seed(pair_seed(self.seed, context, json.dumps(rest, sort_keys=True,
                                                                                                   default=str)))
        x = generate(bb, torch.tensor([prompt], dtype=torch.long).view(1, len(prompt)), steps=steps, gen_length=length,
                     block_length=block,
                     temperature=temperature, cfg_scale=self.gen["cfg_scale"], remasking=self.gen["remasking"],
                     generator=g, state=state, cache=self.gen["cache"], threshold=self.gen["threshold"],
                     refresh_every=self.gen["refresh_every"])
        # the answer ends at its first special token, cut on the ids (sampler.until_special, as continuations
        # cuts): decoded, the end-of-text token left a separator before it ("Pellmoor. <|eos|>"), a trailing space
        text = bb.decode(until_special(bb, x[0, len(prompt):].tolist()))
        # then at the first of the task's stop sequences, kept as written (lm-eval's own models strip nothing)
        return cut_at(text, until, strip=False)

    # ---------------------------------------------------------------- chat templates

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.backbone.tokenizer, "name_or_path", self.backbone.name).replace("/", "__")

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        tok = self.backbone.tokenizer
        if not getattr(tok, "chat_template", None):
            raise TimeromeError(f"{self.backbone.name}'s tokenizer has no chat template: drop --apply_chat_template")
        return tok.apply_chat_template(chat_history, tokenize=False, add_generation_prompt=add_generation_prompt)


def task_manager(include_path=()):
    """lm-eval's index of its tasks (and of the folders in include_path): about 10 s to build, so a caller
    that evaluates many times builds it once and passes it on (the utility experiment keeps one per run)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(p) for p in include_path] or None)


def _network_errors() -> tuple:
    """The errors a task's data download raises where the Hub cannot be reached (datasets raises the
    built-in ConnectionError; requests its own)."""
    try:
        from requests.exceptions import ConnectionError as RequestsConnectionError
    except ImportError:
        return (ConnectionError,)
    return ConnectionError, RequestsConnectionError


NETWORK_ERRORS = _network_errors()
NO_HUB = ("lm-eval downloads each task's data from the Hugging Face Hub; without internet it needs them on this "
          "machine: a datasets cache filled beforehand (and HF_DATASETS_OFFLINE=1), or task YAMLs over local "
          "files (--include_path)")


def _failure(e: BaseException) -> str:
    """An lm-eval failure in one line: its first line, and for a network failure what to do offline."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{text}; {NO_HUB}" if isinstance(e, NETWORK_ERRORS) else text


@contextmanager
def _refused(tasks):
    """lm-eval's failures to load or run tasks as one TimeromeError line (an unknown task, a malformed
    task file, no Hub)."""
    try:
        yield
    except (KeyError, ValueError, *NETWORK_ERRORS) as e:
        raise TimeromeError(f"lm-eval could not run tasks {', '.join(map(str, tasks))}: {_failure(e)}") from None


# lm-eval's own scoring (ConfigurableTask.process_results, read in lm-eval 0.4.13), per output type: the metrics
# that never read is_greedy (a loglikelihood task's acc is is_greedy itself; a multiple-choice exact_match is the
# gold choice's is_greedy). Any other metric, a custom process_results or a task class of its own may read it.
GREEDY_UNREAD = {"loglikelihood": {"perplexity"},
                 "multiple_choice": {"acc", "acc_norm", "acc_bytes", "acc_mutual_info", "f1", "mcc", "brier_score",
                                     "likelihood"}}
NO_LOGLIKELIHOOD = ("generate_until", "loglikelihood_rolling")  # output types that ask no loglikelihood request
# lm-eval's own process_results functions read (0.4.13) and found to read no is_greedy: (its task folder, name).
# truthfulqa_mc2's, one of the utility's default tasks: `ll, _ = zip(*results)` (6.4k needless generations before)
GREEDY_UNREAD_PROCESSORS = {("truthfulqa", "process_results_mc2")}


def reads_greedy(task) -> bool:
    """Whether lm-eval's score of one (leaf) task may read is_greedy: False only where it provably does not."""
    from lm_eval.api.task import ConfigurableTask

    kind = getattr(task, "OUTPUT_TYPE", None)
    if not isinstance(task, ConfigurableTask) or any(getattr(type(task), f) is not getattr(ConfigurableTask, f)
                                                     for f in ("construct_requests", "process_results")):
        return True  # a task class of its own: its requests and scores are its own business
    if kind in NO_LOGLIKELIHOOD:
        return False
    processor = task.get_config("process_results")
    if callable(processor):
        return not _known_greedy_free(processor)
    return not set(task.higher_is_better()) <= GREEDY_UNREAD.get(kind, set())


def _known_greedy_free(fn) -> bool:
    """Whether `fn` is one of lm-eval's own process_results functions known to read no is_greedy
    (GREEDY_UNREAD_PROCESSORS: the function's name and the lm-eval task folder its file is in)."""
    import inspect
    from pathlib import Path

    try:
        where = Path(inspect.getsourcefile(fn) or "").resolve().parts
    except TypeError:  # a builtin or a callable object: not one of lm-eval's task functions
        return False
    return any(where[-3:-1] == ("tasks", folder) and getattr(fn, "__name__", None) == name
               and "lm_eval" in where for folder, name in GREEDY_UNREAD_PROCESSORS)


def _leaf_tasks(manager, tasks) -> dict:
    """{name: Task} of every task `tasks` name, groups and tags opened (the tasks are built: their data loads)."""
    if hasattr(manager, "load"):  # lm-eval 0.4.13: flat already
        return dict(manager.load(list(tasks))["tasks"])
    from lm_eval.api.task import Task
    from lm_eval.tasks import get_task_dict

    out = {}

    def walk(nested):  # older lm-eval: {group: {name: Task, ...}, name: Task}
        for name, value in nested.items():
            if isinstance(value, dict):
                walk(value)
            elif isinstance(value, Task):
                out[str(name)] = value

    walk(get_task_dict(list(tasks), manager))
    return out


def greedy_readers(tasks, manager) -> list[str]:
    """The tasks among `tasks` (groups and tags opened) whose lm-eval score may read is_greedy (`reads_greedy`):
    those a model with check_greedy=False would score 0 whatever it knows. Builds the tasks (their data loads)."""
    with _refused(tasks):
        return sorted(name for name, task in _leaf_tasks(manager, tasks).items() if reads_greedy(task))


def evaluate_tasks(lm: TimeromeLM, tasks, *, num_fewshot=None, limit=None, include_path=None,
                   seed: int = 0, log_samples: bool = False, manager=None, readers=None) -> dict:
    """lm_eval.simple_evaluate on our model: the task results dict ({"results": ..., "samples": ...}).
    manager: a `task_manager(include_path)` built before (None: built now, about 10 s). A model that skips
    is_greedy (check_greedy=False) is refused where a task's score reads it (it would read 0): readers, the
    tasks' `greedy_readers` where the caller found them before (None: found here when needed)."""
    if register_model is None:
        raise TimeromeError(INSTALL_HINT)
    import lm_eval

    manager = manager if manager is not None else task_manager(include_path or ())
    if not lm.check_greedy:
        readers = greedy_readers(tasks, manager) if readers is None else list(readers)
        if readers:
            raise TimeromeError(f"lm-eval's score of {', '.join(readers)} reads is_greedy (a loglikelihood task's "
                                "acc, a multiple-choice exact_match), which check_greedy=false answers False for "
                                "every request, so it would read 0: leave check_greedy on")
    with _refused(tasks):
        return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit,
                                       task_manager=manager, log_samples=log_samples, random_seed=seed,
                                       numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
                                       bootstrap_iters=1000)


if register_model is not None and __name__ != "__main__":
    register_model(NAME)(TimeromeLM)


def main() -> None:
    """lm-eval's command line with the `timerome` model registered (for lm-eval without entry points)."""
    if register_model is None:
        raise SystemExit(INSTALL_HINT)
    from lm_eval.__main__ import cli_evaluate

    try:
        cli_evaluate()
    except TimeromeError as e:  # ours: one line, exit 2, as the timerome command line does
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except NETWORK_ERRORS as e:  # a task's data out of reach: one line with what to do, not a traceback
        print(f"error: lm-eval could not fetch its task data: {_failure(e)}", file=sys.stderr)
        raise SystemExit(2) from None
    except ValueError as e:  # an unknown task name ("Tasks not found: ..."): the user's typo, one line; any other
        if "Tasks not found" not in str(e):  # error (a bug here or in lm-eval) keeps its traceback
            raise
        print(f"error: lm-eval could not run: {_failure(e)}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    from timerome.integrations.lm_eval_model import \
        main as registered_main  # imports (and registers) under the real name

    registered_main()
