"""Hooks as context managers: keep, edit and stop in one mechanism (baukit's TraceDict, for MDLMs).

Every forward hook in timerome is installed here, by `Hooks`, and removed when its `with` block
ends (also when the body raises). A site is

    (layer, point)   a backbone hook point: point in resid / attn / mlp, or (None, "embed")
    Coordinate       the same; an edit at one with a step fires only at that denoising step (a keep
                     records every forward, whatever its step)
    nn.Module        any module (the locate-then-edit baselines read a down projection's input)

    with Hooks(bb, keep=[(1, "resid")]) as tr:           # keep: one tensor per forward
        bb.logits(ids)
    tr[(1, "resid")][0]                                   # [B, L, H]

    with Hooks(bb, edit={(1, "resid"): fn}, state=st):   # edit: h -> fn(h, state) (None: unchanged)
        generate(bb, prompt, state=st)                    # the sampler sets st.step before each forward

    with Hooks(bb, keep=[(1, "resid")], stop=True) as tr: # stop: the layers above 1 never run
        bb.logits(ids)

    with row_tiles(blocks, 64, st):                       # each block runs on tiles of <= 64 rows;
        bb.logits(ids)                                    # hooks inside a block see st.rows = (start, stop)

`TraceState` carries the denoising step k (the paper's TraceState): the sampler sets it once per
denoising step (a cache refresh and the partial forward that follows are the same step), and an
edit at a Coordinate with a step fires only when state.step equals it. A trajectory (the sampler,
`tie.run_trajectory`, the trace engine) sets the step through `denoising_steps`, which sets it in
the state of every `Hooks` open on the backbone too, and gives each back as it was when the
trajectory ends: an edit installed without handing its state to `generate` meets its step all the
same. Outside a trajectory the step is None: a forward of no denoising step (a likelihood's, one
per Monte-Carlo mask) under an edit of one step is refused (`OutsideTrajectory`), never silently
left unedited. `state.positions` says which absolute token positions the current forward holds
(None: all of them, 0..L-1), and
`state.answer_starts` where each row's answer begins when the caller published it
(`answer_region`: the sampler and the likelihood do). A cached
sampler's partial forward recomputes only a window (`Backbone.window_logits`, which publishes
them as `backbone.held_positions`; every hook copies them into its state before it runs). An edit
acts on the tokens the forward computes, so under a cache it acts on each position when that
position's keys and values are computed; the token `positions` of `keep` and `patch` are
absolute and are mapped through the held positions (a position the forward does not hold is
neither kept nor patched: its cached keys/values are those of the refresh).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext
from typing import Callable

import torch
from torch import nn

from timerome.engine.coordinate import Coordinate
from timerome.errors import TimeromeError

HookFn = Callable[[torch.Tensor, "TraceState"], "torch.Tensor | None"]


class TraceState:
    """The denoising step k of the current forward (None: outside any trajectory), and which positions it holds."""

    def __init__(self, step: int | None = None, positions: torch.Tensor | None = None):
        self.step = step
        self.positions = positions
        self.rows = None  # (start, stop): the batch rows a call inside a `row_tiles` module holds, None: all
        self.ids = None  # the token ids of the forward in flight (Hooks(..., ids=True)), [B, L held]
        self.answer_starts = None  # where each row's answer begins (answer_region), None: unknown

    def __repr__(self) -> str:
        return f"TraceState(step={self.step})"


class OutsideTrajectory(TimeromeError):
    """An edit of one denoising step met a forward of none (module docstring)."""

    def __init__(self, site, step: int, causal: bool = False):
        super().__init__(f"an edit at {site} acts at {step_words(step, causal)}, and a forward that belongs to no "
                         + ("" if causal else "denoising ") + ("step ran under it (a likelihood's: " + LIKELIHOOD_WORDS[causal] + "): read a one-step "
                            "edit in generations" + ("" if causal else " or along the denoising trajectory "
                                                     "(evaluation.trajectory_logprobs, the ablations' Traj columns)")
                            + ", or build it for every step"))


def edit_active(edit, backbone):
    """The context that installs `edit` on `backbone` for a `with` block: a method's Edit (its
    `active()`), a memory (its `applied(backbone)`), or None (nothing). Inside, a memory's yields its
    TraceState."""
    if edit is None:
        return nullcontext()
    if hasattr(edit, "active"):
        return edit.active()
    if hasattr(edit, "applied"):
        return edit.applied(backbone)
    raise TimeromeError(f"an edit must have active() (a method's Edit) or applied(backbone) (a memory), "
                        f"got {type(edit).__name__}")


def one_step(edit) -> int | None:
    """The one denoising step an edit acts at: a memory's, or that of a method's Edit built on memories
    (None: every step, no edit, or one that changed weights)."""
    memories = getattr(edit, "memory", edit)
    steps = {getattr(getattr(m, "coordinate", None), "step", None)
             for m in (memories if isinstance(memories, (list, tuple)) else [memories])} - {None}
    return min(steps) if steps else None


def check_stepless(edit, what: str, backbone=None) -> None:
    """Refuse an edit of one denoising step where `what` reads likelihoods, which have no steps (it
    would read the model unedited: `OutsideTrajectory` mid-forward otherwise); `backbone`: the model read,
    for an autoregressive model's wording."""
    causal = getattr(backbone, "causal", False)
    refuse_one_step(one_step(edit), "the edit", f"{what} reads",
                    "read it in generations (metrics.editing.edit_scores)" + (
                        "" if causal else " or along the trajectory (evaluation.trajectory_logprobs)")
                    + ", or build it for every step", causal=causal)


def refuse_one_step(step: int | None, who: str, reader: str, instead: str, causal: bool = False) -> None:
    """The one refusal of an edit of one denoising step (`who`, acting at `step`; None: every step, nothing
    refused) where `reader` ("evaluate reads", "these metrics read") only likelihoods; `instead`: what to do;
    `causal`: an autoregressive model's, whose step k is the forward writing answer token k and whose likelihood
    is one teacher-forced forward. check_stepless words it for the API; the eval command and the experiments'
    check_cells for theirs."""
    if step is not None:
        raise TimeromeError(f"{who} acts at {step_words(step, causal)}, and {reader} likelihoods "
                            f"({LIKELIHOOD_WORDS[causal]}), which it never meets: {instead}")


# what a likelihood is, that a one-step edit never meets: {causal: words}
LIKELIHOOD_WORDS = {False: "one forward per Monte-Carlo mask, no denoising steps",
                    True: "one forward over the whole given answer, which writes no token"}


def step_words(step: int, causal: bool) -> str:
    """Where an edit of one step acts, in the model's own words: at a denoising step, or at the forward writing an
    autoregressive answer's token `step`."""
    return (f"step {step} only (on an autoregressive model, the forward writing answer token {step})" if causal
            else f"denoising step {step} only")


def check_reached(edit, steps: int | None, what: str, causal: bool = False) -> None:
    """Refuse an edit of one denoising step that `what`, taking `steps` steps (None: unknown ahead,
    e.g. a confidence threshold), never reaches; `causal`: an autoregressive model's, whose steps are the
    tokens it writes."""
    k = one_step(edit)
    if k is not None:
        refuse_unreached(k, steps, "the edit", f"{what} {'write' if causal else 'take'}",
                         f"give them {k + 1} {'tokens' if causal else 'steps'} or more "
                         f"(gen_length, --gen-length{'' if causal else ': one step per token'})", causal=causal)


def refuse_unreached_open(backbone, steps: int | None, runs: str) -> None:
    """Refuse a trajectory of `steps` steps (None: unknown ahead) while a `Hooks` block open on the backbone
    edits at a step it never reaches (an edit memory of step k applied around `generate`): it would run
    unedited, silently."""
    causal = getattr(backbone, "causal", False)
    for hooks in _open_hooks(backbone):
        for site in hooks.edits:
            refuse_unreached(getattr(site, "step", None), steps, "an edit applied to the model", runs,
                             f"give it more {'tokens (gen_length)' if causal else 'steps'}, or apply a memory of "
                             "every step", causal=causal)


def refuse_unreached(step: int | None, steps: int | None, who: str, runs: str, instead: str,
                     causal: bool = False) -> None:
    """The one refusal of an edit of denoising step `step` alone (`who`) that a run of `steps` steps
    (`runs`: "these answers take"; None: unknown ahead) never reaches; `instead`: what to do. `causal`: an
    autoregressive model's run, whose step k is the forward writing answer token k (`runs`: "... write")."""
    if step is not None and steps is not None and step >= steps:
        raise TimeromeError(f"{who} acts at {step_words(step, causal)}, and {runs} {steps} "
                            f"{'tokens' if causal else 'steps'} (0..{steps - 1}): it never acts there; {instead}")


class StopForward(Exception):
    """Raised by a `stop=True` hook once every kept site has been seen; `Hooks` swallows it."""


def site_key(site):
    """One spelling of a site, for looking kept entries up: (layer, point) for a (layer, point) tuple or
    list and for a Coordinate of every step, (layer, point, step) for one of one step (a tuple or list
    of three too); a module (or anything else) as it is."""
    if isinstance(site, Coordinate):
        return site.site if site.step is None else (*site.site, site.step)
    if isinstance(site, (tuple, list)) and len(site) in (2, 3) and isinstance(site[1], str):
        return tuple(site) if len(site) == 2 or site[2] not in (None, -1) else tuple(site[:2])
    return site


def site_name(site) -> str:
    """A site as a message names it: "layer 1 resid" for (1, "resid"), a Coordinate as it prints, a module by
    its class."""
    if isinstance(site, Coordinate):
        return str(site)
    if isinstance(site, (tuple, list)) and len(site) >= 2 and isinstance(site[1], str):
        return f"layer {site[0]} {site[1]}" if site[0] is not None else site[1]
    return f"module {type(site).__name__}" if isinstance(site, nn.Module) else repr(site)


class Hooks(dict):
    """Install keep / edit hooks on backbone sites for a `with` block; a dict site -> kept tensors.

    keep: sites whose outputs (inputs, with inputs=True) are recorded, one entry per forward,
        detached and cloned (detach=False keeps them in the autograd graph), sliced to the token
        `positions` when given, moved to the CPU with to_cpu.
    edit: {site: fn(h, state)}: h is the site's output (output[0] of a tuple); a returned tensor
        replaces it. A Coordinate site with a step edits only at that step. With raw=True, fn gets
        the module's whole output and its return (not None) replaces the whole output.
    stop: after every kept site has been recorded in a forward, stop it (StopForward, swallowed
        on leaving the block): what lies above is never computed.
    ids: before each forward, put its token ids (the embedding's input: the held window's only in a
        cached sampler's partial forward) in `state.ids`, for edits that read the text.
    Edits run before keeps on the same module, so a kept output is the edited one. A kept site is
    found by any spelling of it (`site_key`): tr[(1, "resid")], tr[Coordinate(1, "resid")] and
    tr[[1, "resid"]] are the same entry, kept under the spelling keep gave first.
    """

    def __init__(self, backbone, keep=(), *, edit: dict | None = None, inputs: bool = False, stop: bool = False,
                 state: TraceState | None = None, positions=None, to_cpu: bool = False, detach: bool = True,
                 raw: bool = False, ids: bool = False):
        for site in keep:  # "resid" or (1, "resid") alone would be read letter by letter, or number by name
            if not isinstance(site, (Coordinate, nn.Module)) and not (
                    isinstance(site, (tuple, list)) and len(site) == 2 and isinstance(site[1], str)):
                raise TimeromeError(f"keep takes a list of sites, each (layer, point), a Coordinate or a module, "
                                    f"got {site!r} in {keep!r}: e.g. keep=[(1, 'resid')]")
        self._spellings = {}  # site_key(site) -> the key the site is kept under (its first spelling in keep)
        for site in keep:
            self._spellings.setdefault(site_key(site), tuple(site) if isinstance(site, list) else site)
        super().__init__({site: [] for site in self._spellings.values()})
        self.backbone = backbone
        if edit is not None and not isinstance(edit, dict):
            raise TimeromeError(f"edit takes a dict {{site: fn(h, state)}}, got {type(edit).__name__}")
        self.edits = dict(edit or {})
        for site, fn in self.edits.items():  # checked here, not at the first forward deep inside the model
            _check_editor(site, fn)
        self.state = state if state is not None else TraceState()
        self.inputs, self.stop, self.positions = inputs, stop, positions
        self.to_cpu, self.detach, self.raw, self.ids = to_cpu, detach, raw, ids
        if stop and not keep:
            raise TimeromeError("stop=True needs at least one kept site (keep=[...]): it stops after the last one")
        self._handles = []
        self._forwards = 0

    def _kept_as(self, site):
        """The key `site` is kept under, whichever spelling of it is given (not kept: itself, a list as a tuple)."""
        key = site_key(site)
        return self._spellings.get(key, key if isinstance(site, list) else site)

    def __getitem__(self, site):
        return super().__getitem__(self._kept_as(site))

    def __contains__(self, site) -> bool:
        return super().__contains__(self._kept_as(site))

    def get(self, site, default=None):
        return super().get(self._kept_as(site), default)

    def module(self, site) -> nn.Module:
        if isinstance(site, nn.Module):
            return site
        layer, point = site.site if isinstance(site, Coordinate) else tuple(site)
        return self.backbone.module(layer, point)

    def __enter__(self):
        try:
            if self.ids:
                self._handles.append(self.backbone.embedding().register_forward_pre_hook(self._ids_keeper))
            for site, fn in self.edits.items():
                self._handles.append(self.module(site).register_forward_hook(self._editor(site, fn)))
            for site in list(self):
                mod = self.module(site)
                if self.inputs:
                    self._handles.append(mod.register_forward_pre_hook(self._input_keeper(site)))
                else:
                    self._handles.append(mod.register_forward_hook(self._keeper(site)))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        _open_hooks(self.backbone).append(self)  # a trajectory sets their state's step (`denoising_steps`)
        return self

    def __exit__(self, exc_type, exc, tb):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        live = _open_hooks(self.backbone)
        live[:] = [h for h in live if h is not self]  # by identity: a Hooks is a dict, equal to any alike
        return exc_type is not None and issubclass(exc_type, StopForward)

    # ------------------------------------------------------------------ the hook functions

    def _held(self) -> torch.Tensor | None:
        """Absolute positions of the forward in flight (None: all), copied into the state."""
        self.state.positions = getattr(self.backbone, "held_positions", None)
        self.state.answer_starts = getattr(self.backbone, "answer_starts", None)
        return self.state.positions

    def _editor(self, site, fn):
        step = site.step if isinstance(site, Coordinate) else None
        state = self.state

        def hook(_module, _inputs, output):
            self._held()
            if step is not None and state.step != step:
                if state.step is None:
                    raise OutsideTrajectory(site, step, getattr(self.backbone, "causal", False))
                return None
            if self.raw:
                return fn(output, state)
            h = output[0] if isinstance(output, tuple) else output
            new = fn(h, state)
            if new is None:
                return None
            if not isinstance(new, torch.Tensor) or new.shape != h.shape:  # a shape failed deep in the next layer
                got = f"a tensor of shape {tuple(new.shape)}" if isinstance(new, torch.Tensor) else type(new).__name__
                raise TimeromeError(f"the edit function at {site_name(site)} must return a tensor of its input's "
                                    f"shape {tuple(h.shape)} (or None: unchanged), got {got}")
            return (new, *output[1:]) if isinstance(output, tuple) else new

        return hook

    def _ids_keeper(self, _module, args):
        self.state.ids = args[0] if args else None

    def _keeper(self, site):
        def hook(_module, _inputs, output):
            self._record(site, output[0] if isinstance(output, tuple) else output)

        return hook

    def _input_keeper(self, site):
        def hook(_module, args):
            self._record(site, args[0])

        return hook

    def _record(self, site, h: torch.Tensor):
        held = self._held()
        if self.positions is None:
            v = h
        else:
            v = h[:, self.positions] if held is None else h[:, held_index(self.positions, held)[0]]
        if self.detach:
            v = v.detach().clone()
        self[site].append(v.cpu() if self.to_cpu else v)
        if self.stop and all(len(v) > self._forwards for v in self.values()):
            self._forwards += 1
            raise StopForward


def held_index(positions, held: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(local, which): of the absolute token `positions` (ints, a LongTensor or a slice), which ones
    a forward holding the absolute positions `held` [W] has (bool per position), and their indices
    in that forward (in the order of `positions`)."""
    if isinstance(positions, slice):
        positions = torch.arange(int(held.max()) + 1, device=held.device)[positions]
    pos = torch.as_tensor(positions, device=held.device).reshape(-1)
    match = pos[:, None] == held[None, :]  # [P, W]
    which = match.any(1)
    return match.long().argmax(1)[which], which


@contextmanager
def answer_region(backbone, starts):
    """Publish, for the forwards inside the block, where each row's answer region begins: an int
    (every row) or a LongTensor [B]. The sampler and the likelihood do (the prompt ends there); an
    edit that writes answers aligns on it (every hook copies it into its state as
    `state.answer_starts`). Outside such a block it is None: nobody said where an answer starts."""
    before = getattr(backbone, "answer_starts", None)
    backbone.answer_starts = starts
    try:
        yield
    finally:
        backbone.answer_starts = before


def _open_hooks(backbone) -> list:
    """The `Hooks` blocks open on backbone, oldest first."""
    live = getattr(backbone, "open_hooks", None)
    if live is None:
        live = backbone.open_hooks = []
    return live


@contextmanager
def denoising_steps(backbone, state=None):
    """A denoising trajectory on `backbone`: yields at(k), which marks the forwards that follow as
    step k's, in `state` when given and in the state of every `Hooks` block open on the backbone (so
    an edit of one step meets it without its state being handed over). On leaving, each state it set
    has the step it had before: outside any trajectory the step is None."""
    before: dict[int, tuple] = {}  # id(state) -> (state, its step before the trajectory)

    def at(k: int) -> None:
        for s in [h.state for h in _open_hooks(backbone)] + ([state] if state is not None else []):
            if id(s) not in before:
                before[id(s)] = (s, s.step)
            s.step = k

    try:
        yield at
    finally:
        for s, step in before.values():
            s.step = step


@contextmanager
def once_on(edit, backbone):
    """The block in which `edit` (a memory, a gated edit) is applied to `backbone`, refused where it is
    applied there already (an `applied` block inside another of the same edit): its update would be
    added twice, a silently stronger edit."""
    on = edit.__dict__.setdefault("_applied_on", set())
    if id(backbone) in on:
        raise TimeromeError(f"this {type(edit).__name__} is already applied to this model (a block applying it "
                            "inside another): applying it again would add its update twice; apply it once")
    on.add(id(backbone))
    try:
        yield
    finally:
        on.discard(id(backbone))


# ------------------------------------------------------------------------------ common uses


def capture(backbone, sites, state: TraceState | None = None, positions=None, to_cpu: bool = False) -> Hooks:
    """Keep each site's output at every forward: store[site] is a list, one tensor per forward."""
    return Hooks(backbone, sites, state=state, positions=positions, to_cpu=to_cpu)


def _check_editor(site, fn) -> None:
    """An edit function takes (h, state): anything else (a number, a function of h alone) is refused naming the
    site, before a forward calls it."""
    if not callable(fn):
        raise TimeromeError(f"the edit at {site!r} must be a function fn(h, state) -> tensor or None, got "
                            f"{type(fn).__name__}")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise TimeromeError(f"the edit function at {site!r} must take two arguments, (h, state): the site's output "
                            "and the TraceState (its step and positions)") from None
    except ValueError:  # a builtin without a signature: called as it is
        pass


def Intervention(backbone, fns: dict, state: TraceState | None = None) -> Hooks:  # noqa: N802 - reads as a class
    """Edit hooks only: {site: fn(h, state) -> tensor | None}."""
    return Hooks(backbone, edit=fns, state=state)


def patch(backbone, values: dict, positions, state: TraceState | None = None, at_step: int | None = None) -> Hooks:
    """Splice values[site] [B or 1, P, H] into the site's output at token `positions` (only at
    denoising step `at_step` when given)."""

    def splicer(site):
        def fn(h, state):
            out = h.clone()
            if state.positions is None:
                out[:, positions] = values[site].to(h.dtype)
            else:  # a partial forward: the patched positions it holds
                local, which = held_index(positions, state.positions)
                out[:, local] = values[site][:, which].to(h.dtype)
            return out

        return fn

    return Hooks(backbone, edit={Coordinate(*s, step=at_step) if at_step is not None else s: splicer(s)
                                 for s in values}, state=state)


def edit(backbone, site, fn: Callable[[torch.Tensor], torch.Tensor], state: TraceState | None = None) -> Hooks:
    """Replace the site's output h by fn(h) at every forward (at one step for a Coordinate with a step)."""
    return Hooks(backbone, edit={site: lambda h, _st: fn(h)}, state=state)


@contextmanager
def row_tiles(modules, rows: int, state: TraceState):
    """Inside the block, each module's forward runs on tiles of at most `rows` consecutive rows of
    its first input (the hidden states [B, L, H]), as near equal as they can be, and returns their
    outputs concatenated (a tensor, or a (tensor, None, ...) tuple): a batch too large for the CPU's
    cache computed in pieces that fit. The module's own hooks see the whole batch once; the hooks of
    the modules inside it see one tile at a time, with `state.rows` = (start, stop) of the tile's
    rows in the batch (None whenever a call holds the whole batch). The module's other inputs must
    broadcast over the batch (they are passed whole to every tile); the numbers are the untiled
    ones where a row's arithmetic does not depend on the rest of its batch (the trace engine checks
    it on the backbone: `wavefront.rows_can_tile`)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    saved = []

    def tiled(run):
        def forward(*args, **kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            sizes = tile_sizes(x.shape[0], rows)
            if len(sizes) == 1:
                return run(*args, **kwargs)
            outs, a = [], 0
            try:
                for size in sizes:
                    state.rows = (a, a + size)
                    part = x[a:a + size]
                    outs.append(run(part, *args[1:], **kwargs) if args else run(**{**kwargs, "hidden_states": part}))
                    a += size
            finally:
                state.rows = None
            parts = [hidden_states(o) for o in outs]
            if any(h is None for h in parts) or len({type(o) for o in outs}) > 1:
                raise TypeError(f"row_tiles: a module output of type {type(outs[0]).__name__} cannot be concatenated")
            return with_hidden_states(outs[0], torch.cat(parts))

        return forward

    try:
        for m in modules:
            saved.append((m, m.__dict__.get("forward")))
            m.forward = tiled(m.forward)
        yield
    finally:
        for m, before in reversed(saved):
            if before is None:
                del m.forward
            else:
                m.forward = before
        state.rows = None


def hidden_states(output) -> torch.Tensor | None:
    """The hidden states of a module output that holds nothing else (a tensor, or a (tensor, None,
    ...) tuple, as a block returns them): what rows can be cut from or added to; None otherwise."""
    if torch.is_tensor(output):
        return output
    if type(output) is tuple and output and torch.is_tensor(output[0]) and all(t is None for t in output[1:]):
        return output[0]
    return None


def with_hidden_states(output, h: torch.Tensor):
    """`output` (as `hidden_states` takes it) with its hidden states replaced by h."""
    return h if torch.is_tensor(output) else (h, *output[1:])


def tile_sizes(batch: int, rows: int) -> list[int]:
    """The tiles `row_tiles` cuts a batch of `batch` rows into: as few as hold at most `rows` rows
    each, of near equal sizes (the larger first), so that no tile holds only a few rows."""
    n = max(1, -(-batch // rows))
    return [batch // n + (i < batch % n) for i in range(n)]


def run_to(backbone, site, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
           detach: bool = True) -> torch.Tensor:
    """The output [B, L, H] of `site` on ids [B, L], without computing the layers above it.
    attention_mask [B, L] marks real tokens (None or all True: no padding)."""
    am = None if attention_mask is None or bool(attention_mask.all()) else attention_mask
    with Hooks(backbone, [site], stop=True, detach=detach) as tr:
        backbone.logits(ids, attention_mask=am)
    return tr[site][0]
