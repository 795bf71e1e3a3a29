"""Executors: who computes the cells a Runner has not cached. `runner.local_executor` (this process,
in order) is the default; `ray_executor` hands the cells to Ray workers.

    runner = Runner("runs/canonical", executor=ray_executor("auto"))     # a running cluster
    run_experiment("canonical", executor=ray_executor())                 # a local Ray instance

A cell is a pure function of itself and the context's model and data (`runner.execute`), so a worker
only needs to rebuild the context: each Ray actor loads the checkpoint once (`ContextSpec`: its
directory, family, dtype, the device kind) and checks that the weights' fingerprint is the driver's,
then computes cells one after the other. Where the model sits on a GPU every actor takes one GPU
(one cell per GPU at a time); on CPU an actor takes `cpus_per_cell` cores with as many torch threads,
so cells are packed one per core. Results come back to the driver, whose `done` writes the same cache
the local executor writes: a sweep started on one executor resumes on any other, and a cell that is
cached is never computed again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from timerome.backbones import Backbone, load_backbone
from timerome.common import allocator
from timerome.common.progress import progress_bar
from timerome.errors import TimeromeError
from timerome.experiments.runner import Context, execute, local_executor

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class ModelSpec:
    """What a worker needs to load the same weights again."""

    checkpoint: str
    family: str
    dtype: str
    remote: bool
    fingerprint: str

    @classmethod
    def of(cls, bb: Backbone) -> "ModelSpec":
        ckpt = (bb.info or {}).get("checkpoint")
        if not ckpt:
            raise TimeromeError(f"{bb.name} was not loaded from a checkpoint directory, so Ray workers cannot "
                                "load it: save it (a directory with config.json) and pass that directory")
        return cls(str(ckpt), bb.family.name, str(bb.dtype).removeprefix("torch."), bool(bb.remote), bb.fingerprint())

    def load(self, device: str) -> Backbone:
        bb = load_backbone(self.checkpoint, self.family, dtype=self.dtype, device=device,
                           trust_remote_code=self.remote)
        if bb.fingerprint() != self.fingerprint:
            raise TimeromeError(f"the weights in {self.checkpoint} (fingerprint {bb.fingerprint()}) are not the "
                                f"driver's model (fingerprint {self.fingerprint}): the driver changed them in "
                                "memory; save them to a directory and pass that")
        return bb


@dataclass(frozen=True)
class ContextSpec:
    """A runner.Context, as data a worker can rebuild it from."""

    model: ModelSpec
    device: str                     # "cuda" or "cpu": the kind, each worker uses the device Ray gives it
    source: object = "embedded"
    reference: object = None        # None, "embedded", "train", a directory, or a ModelSpec
    reference_options: dict = field(default_factory=dict)
    model_path: object = None

    @classmethod
    def of(cls, ctx) -> "ContextSpec":
        ref = ModelSpec.of(ctx.reference) if isinstance(ctx.reference, Backbone) else ctx.reference
        return cls(ModelSpec.of(ctx.backbone), ctx.backbone.device.type, ctx.source, ref,
                   dict(ctx.reference_options), ctx.model_path)

    def context(self) -> Context:
        device = "cuda" if self.device == "cuda" else "cpu"
        ref = self.reference.load(device) if isinstance(self.reference, ModelSpec) else self.reference
        return Context(self.model.load(device), self.source, reference=ref,
                       reference_options=dict(self.reference_options), model_path=self.model_path, progress=False)


class CellWorker:
    """One Ray actor: the context built once, then any number of cells."""

    def __init__(self, spec: ContextSpec, threads: int, keep_memory: bool = True):
        # unpickling this class imported timerome.experiments, so every experiment's @measurement is here
        torch.set_num_threads(max(1, int(threads)))
        if keep_memory:  # a worker process of timerome's own, set up as the command line sets its process
            allocator.keep_freed_memory()
        self.ctx = spec.context()

    def run(self, i: int, cell) -> tuple[int, dict]:
        return i, execute(cell, self.ctx)


def ray_executor(address: str | None = None, *, cpus_per_cell: int = 1, max_workers: int | None = None,
                 init_options: dict | None = None):
    """An executor that runs cells on Ray actors (module docstring).

    address: None starts (or joins) a local Ray instance; "auto" or "ray://host:port" joins a cluster.
    cpus_per_cell: CPU cores (and torch threads) per actor when the model is on CPU.
    max_workers: at most this many actors (default: as many as the cluster's GPUs, or CPUs / cpus_per_cell).
    """
    if int(cpus_per_cell) < 1:
        raise TimeromeError(f"cpus_per_cell must be >= 1, got {cpus_per_cell}")

    def execute_on_ray(cells, ctx, done, progress: bool = True, title: str = "cells") -> None:
        if not cells:
            return
        ray = connect(address, init_options)
        spec = ContextSpec.of(ctx)
        gpu = spec.device == "cuda"
        total = ray.cluster_resources().get("GPU" if gpu else "CPU", 0)
        slots = int(total) if gpu else int(total // int(cpus_per_cell))
        if slots < 1:
            raise TimeromeError(f"the Ray cluster at {address or 'local'} has no {'GPU' if gpu else 'CPU'} "
                                f"for a cell (the model is on {spec.device}); add one or run with --executor local")
        n = min(len(cells), slots, max_workers or slots)
        actor = ray.remote(num_gpus=1 if gpu else 0, num_cpus=0 if gpu else int(cpus_per_cell))(CellWorker)
        spec_ref = ray.put(spec)
        keep = allocator.wanted()  # read here, in the driver: a bad $TIMEROME_KEEP_MEMORY is one line, not an actor's
        workers = [actor.remote(spec_ref, 1 if gpu else int(cpus_per_cell), keep) for _ in range(n)]
        pending = {}
        queue = list(enumerate(cells))
        try:
            for w in workers:
                if queue:
                    pending[w.run.remote(*queue.pop(0))] = w
            with progress_bar(f"{title} on ray ({n} workers)", total=len(cells), enabled=progress) as bar:
                while pending:
                    ready, _ = ray.wait(list(pending), num_returns=1)
                    w = pending.pop(ready[0])
                    i, result = _result(ray, ready[0])
                    done(i, result)
                    bar.advance(description=f"{title}: {cells[i].row or cells[i].method} seed {cells[i].seed}")
                    if queue:
                        pending[w.run.remote(*queue.pop(0))] = w
        finally:
            for w in workers:
                ray.kill(w)

    return execute_on_ray


def _result(ray, ref):
    """A finished cell's (index, result); a worker's failure as one TimeromeError."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else None
        if isinstance(cause, TimeromeError):
            raise TimeromeError(str(cause)) from None
        raise TimeromeError(f"a Ray worker failed on a cell: {type(cause).__name__ if cause else 'error'}: "
                            f"{str(cause or e).strip().splitlines()[-1]}") from None
    except ray.exceptions.RayActorError as e:
        raise TimeromeError(f"a Ray worker died ({str(e).strip().splitlines()[0]}); finished cells are cached: "
                            "rerun to resume") from None


def connect(address: str | None = None, init_options: dict | None = None):
    """The ray module, initialised: joins `address` (None: a local instance, started here if needed)."""
    try:
        import ray
    except ImportError:
        raise TimeromeError("the ray executor needs Ray: pip install 'timerome[ray]'") from None
    if not ray.is_initialized():
        opts = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        opts.update(init_options or {})
        try:
            ray.init(address=address, **opts)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise TimeromeError(f"cannot start or join Ray at {address or 'a local instance'}: "
                                f"{str(e).strip().splitlines()[0]}") from None
    return ray


def make_executor(name: str = "local", address: str | None = None):
    """The executor a command line names: "local" (default) or "ray" (with --ray-address)."""
    if name == "local":
        if address:
            raise TimeromeError("--ray-address needs --executor ray")
        return local_executor
    if name == "ray":
        return ray_executor(address)
    raise TimeromeError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
