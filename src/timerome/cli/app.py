"""The typer app, its error handler and the options every command that loads a model shares."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import wraps
from typing import Optional

import typer
from rich.console import Console

from timerome.errors import TimeromeError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Find where a masked diffusion LM stores a fact, then make it forget it at inference time.")
console = Console()

ModelOpt = typer.Option(None, "--model", "-m", help="checkpoint directory (default: the embedded model)")
FamilyOpt = typer.Option(None, "--family", help="backbone family (default: from config.json)")
RemoteOpt = typer.Option(False, "--trust-remote-code", help="run the checkpoint's own modelling code")
DeviceOpt = typer.Option("cpu", "--device", help="torch device: cpu, cuda, cuda:1, mps")
DtypeOpt = typer.Option(None, "--dtype", help="float32 (default), bfloat16 or float16")
DataOpt = typer.Option("embedded:forget01", "--data", "-d",
                       help="facts: 'embedded:SPLIT', 'tofu:SPLIT' (with --tofu-dir) or a JSON/JSONL file of "
                            "question/answer rows (with 'author' or 'subject' where the subject is not a TOFU author)")
TofuOpt = typer.Option(None, "--tofu-dir", help="local TOFU directory in the Hub layout")


def friendly(fn):
    """TimeromeError or a file-system error -> one red line and exit code 2, never a traceback."""

    @wraps(fn)
    def inner(*a, **k):
        try:
            return fn(*a, **k)
        except TimeromeError as e:
            console.print(f"[bold red]error:[/] {e}")
            raise typer.Exit(2)
        except OSError as e:  # an unwritable output folder, a full disk, a vanished file
            where = f" ({e.filename})" if e.filename else ""
            console.print(f"[bold red]error:[/] {e.strerror or e}{where}")
            raise typer.Exit(2)

    return inner


@app.callback()
@friendly
def _options(threads: Optional[int] = typer.Option(
        None, "--threads", help="CPU threads torch may use (default: torch's own choice, one per core)")):
    # a shared machine or several jobs at once: fewer threads than cores avoids oversubscription
    if threads is not None:
        if threads < 1:
            raise TimeromeError(f"--threads must be at least 1, got {threads}")
        import torch

        torch.set_num_threads(threads)


@dataclass(frozen=True)
class ModelChoice:
    """The model a command works on, as its options name it."""

    model: str | None = None
    family: str | None = None
    trust_remote_code: bool = False
    device: str = "cpu"
    dtype: str | None = None

    def load(self):
        from timerome.backbones import load_backbone

        return load_backbone(self.model, self.family, dtype=self.dtype, device=self.device,
                             trust_remote_code=self.trust_remote_code)


_MODEL_OPTIONS = (("model", Optional[str], ModelOpt), ("family", Optional[str], FamilyOpt),
                  ("trust_remote_code", bool, RemoteOpt), ("device", str, DeviceOpt), ("dtype", Optional[str], DtypeOpt))


def model_options(fn):
    """Give a command --model, --family, --trust-remote-code, --device and --dtype; the function's
    `model` parameter receives them as one ModelChoice (typer reads the rewritten signature)."""
    names = [n for n, _, _ in _MODEL_OPTIONS]

    @wraps(fn)
    def inner(*args, **kwargs):
        return fn(*args, model=ModelChoice(**{n: kwargs.pop(n) for n in names}), **kwargs)

    own = [p for p in inspect.signature(fn).parameters.values() if p.name != "model"]
    extra = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)
             for n, ann, opt in _MODEL_OPTIONS]
    inner.__signature__ = inspect.Signature(own + extra)
    inner.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "model"} | {
        n: ann for n, ann, _ in _MODEL_OPTIONS}
    return inner


def load_facts(data: str, tofu_dir, limit=None):
    """Facts of a QA set; every row that gives no fact is shown, never dropped silently."""
    from timerome.data.rows import load_facts as load

    facts, skipped = load(data, tofu_dir=tofu_dir, limit=limit)
    for i, why in skipped[:10]:
        console.print(f"[yellow]skipped row {i}:[/] {why}")
    if len(skipped) > 10:
        console.print(f"[yellow]... and {len(skipped) - 10} more rows skipped[/]")
    return facts


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise TimeromeError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds:
        raise TimeromeError("give at least one seed")
    return seeds
