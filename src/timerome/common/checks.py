"""Every number that enters a computation, checked before any work: one helper per kind of check.

Whatever a number comes from (a command-line option, an experiment config, a checkpoint's
config.json, a memory or trace file, a Python argument), the same helper judges it, and a bad one
is one TimeromeError naming where it came from:

    number(v, "--temperature", lo=0)            a finite real (never a bool), in range
    integer(v, "--steps", lo=1)                 an int (never a bool or a float) within 64 bits, in range
    is_int(v), is_real(v)                       the same kinds as predicates, for tables of rules
    seed(v, "--seed")                           an int in [0, 2**63)
    nonfinite_path(doc)                         where a JSON document holds NaN or inf ("a.b[2]"), or None
    finite_tensor(t, "tensor U of f.safetensors")   no NaN / inf; says how many and where the first is
    budget(what, forwards)                      refuse work beyond FORWARD_LIMIT model forwards
    memory_budget(what, n_bytes, device)        refuse an allocation beyond the memory the device has free

Budgets refuse an absurd size (`--steps 1000000000`, `"n_mc": 10**18`, a config with a billion
layers) before memory is allocated or a forward runs, with the estimate in the message. To run
it anyway: `timerome --insist ...`, `TIMEROME_INSIST=1`, or `with checks.insisting(): ...`.
"""

from __future__ import annotations

import math
import numbers
import os
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar

from timerome.errors import TimeromeError

INT64 = 2**63  # integers a tensor, a generator or a C library can hold: |v| < 2**63
# model forwards (one sequence through the model each) a piece of work may need without --insist:
# 100x the paper's largest experiment on TOFU, weeks of a large model on one accelerator
FORWARD_LIMIT = 10**8
# --insist for this command / `insisting()` block: context-scoped (a thread or task starts without it)
INSIST: ContextVar[bool] = ContextVar("timerome_insist", default=False)


# ------------------------------------------------------------------------------ numbers


def is_int(v) -> bool:
    """Whether `v` is an integer a computation can hold: not a bool, |v| < 2**63 (a predicate; `integer` refuses)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and abs(int(v)) < INT64


def is_real(v) -> bool:
    """Whether `v` is a finite real number: not a bool, not None (JSON's NaN), an integer within 64 bits."""
    return (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))
            and (not isinstance(v, numbers.Integral) or is_int(v)))


def number(value, what: str, *, lo=None, hi=None, lo_open: bool = False, hi_open: bool = False,
           none: bool | str = False):
    """`value` if it is a finite real number (not a bool) in [lo, hi] (open ends on request). none: None is
    taken too (a string: how the caller's users give none, for the message; True: "or null", JSON's)."""
    if value is None and none:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or (
            isinstance(value, numbers.Integral) and abs(int(value)) >= INT64):
        raise TimeromeError(f"{what} must be {_range('a finite number', lo, hi, lo_open, hi_open, none)}, "
                            f"got {shown(value)}")
    if not math.isfinite(float(value)) or not _inside(value, lo, hi, lo_open, hi_open):
        raise TimeromeError(f"{what} must be {_range('a finite number', lo, hi, lo_open, hi_open, none)}, "
                            f"got {shown(value)}")
    return value


def integer(value, what: str, *, lo=None, hi=None, none: bool | str = False):
    """`value` if it is an integer (not a bool, not a float) with |value| < 2**63, in [lo, hi] (none: as `number`)."""
    if value is None and none:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) >= INT64:
        raise TimeromeError(f"{what} must be an integer below 2**63 (64 bits), got {shown(value)}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not _inside(value, lo, hi, False, False):
        raise TimeromeError(f"{what} must be {_range('an integer', lo, hi, False, False, none)}, got {shown(value)}")
    return int(value)


def seed(value, what: str = "seed") -> int:
    """A seed every generator takes (torch, numpy, Python): an integer in [0, 2**63)."""
    return integer(value, what, lo=0, hi=INT64 - 1)


def generator_arg(generator, what: str = "generator"):
    """`generator` if it is a torch.Generator or None, else one TimeromeError saying how to seed one."""
    import torch

    if generator is not None and not isinstance(generator, torch.Generator):
        raise TimeromeError(f"{what} must be a torch.Generator (every random draw comes from it) or None, got "
                            f"{type(generator).__name__} {generator!r:.40}; seed one: "
                            "torch.Generator(device=backbone.device).manual_seed(SEED)")
    return generator


def repeated(values) -> list:
    """The values a list gives more than once, each once, sorted: the one test behind every "given twice" refusal
    (seeds, methods, alphas, retain authors)."""
    counts = Counter(values)  # one pass: a memory's 10^4 fact ids were O(n^2) with list.count
    return sorted(v for v, n in counts.items() if n > 1)


def seeds(values, what: str = "seeds") -> tuple[int, ...]:
    """A list of seeds, each a `seed`, at least one and none twice (a run counted twice would weigh
    twice in a mean and a paired test)."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):  # not read letter by letter
        raise TimeromeError(f"{what} must be a list of seeds, e.g. (0, 1, 2) or [0], got {shown(values)}")
    out = tuple(seed(v, f"a seed of {what}") for v in values)
    if not out:
        raise TimeromeError(f"give at least one seed ({what})")
    twice = repeated(out)
    if twice:
        raise TimeromeError(f"{what} repeats {', '.join(map(str, twice))}: each seed is one run, give it once")
    return out


def is_token_ids(value) -> bool:
    """Whether `value` is a list of token ids (ints >= 0, no bools): what a file records of a sequence start."""
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _inside(v, lo, hi, lo_open, hi_open) -> bool:
    if lo is not None and (v <= lo if lo_open else v < lo):
        return False
    return hi is None or (v < hi if hi_open else v <= hi)


def _range(kind: str, lo, hi, lo_open, hi_open, none) -> str:
    if hi is not None and hi >= INT64 - 1:
        hi = None  # "below 2**63" says it
    def num(v) -> str:  # a whole bound exactly (2147483647, not 2.14748e+09), any other as :g
        return str(int(v)) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else f"{v:g}"

    if lo is not None and hi is not None:
        text = f"{kind} in {'(' if lo_open else '['}{num(lo)}, {num(hi)}{')' if hi_open else ']'}"
    elif lo is not None:
        text = f"{kind} {'>' if lo_open else '>='} {num(lo)}"
    elif hi is not None:
        text = f"{kind} {'<' if hi_open else '<='} {num(hi)}"
    else:
        text = kind
    return text + (f" ({none})" if isinstance(none, str) else " (or null)" if none else "")


def shown(value) -> str:
    """A value as a message shows it: a 300-digit integer by its size, not its digits."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) >= 10**20:
        return f"an integer of {len(str(abs(int(value))))} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------------------ documents and tensors


def nonfinite_path(doc, where: str = "") -> str | None:
    """The path ("methods[0].config.alpha") of the first NaN / inf number in a JSON document, or None."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return where or "the document"
    if isinstance(doc, dict):
        for k, v in doc.items():
            found = nonfinite_path(v, f"{where}.{k}" if where else str(k))
            if found:
                return found
    elif isinstance(doc, (list, tuple)):
        for i, v in enumerate(doc):
            found = nonfinite_path(v, f"{where}[{i}]")
            if found:
                return found
    return None


def big_int_path(doc, where: str = "") -> str | None:
    """The path of the first integer of a JSON document beyond 64 bits, or None."""
    if isinstance(doc, numbers.Integral) and not isinstance(doc, bool) and abs(int(doc)) >= INT64:
        return where or "the document"
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, (list, tuple)):
        items = ((f"[{i}]", v) for i, v in enumerate(doc))
    else:
        return None
    for k, v in items:
        key = k if str(k).startswith("[") else (f".{k}" if where else str(k))
        found = big_int_path(v, f"{where}{key}")
        if found:
            return found
    return None


def finite_tensor(t, what: str, hint: str = "the file is damaged or was made from a broken model") -> None:
    """Refuse a floating tensor holding NaN or inf: how many, the index of the first, and `hint`."""
    import torch

    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return
    ok = torch.isfinite(t)
    if bool(ok.all()):
        return
    bad = (~ok).nonzero()[0].tolist()
    first = t[tuple(bad)].item()
    raise TimeromeError(f"{what} holds {int((~ok).sum())} non-finite values of {t.numel()} (the first, {first}, "
                        f"at index {tuple(bad)}): {hint}")


# ------------------------------------------------------------------------------ budgets


def insisting_now() -> bool:
    """Whether budgets let absurd work through (--insist, TIMEROME_INSIST=1, `insisting()`)."""
    from timerome.common.environment import switch

    return INSIST.get() or switch("TIMEROME_INSIST")


def set_insist(value: bool) -> None:
    """What `timerome --insist` sets for one command."""
    INSIST.set(bool(value))


@contextmanager
def insisting():
    """Budgets do not refuse inside the block (the Python API's --insist)."""
    token = INSIST.set(True)
    try:
        yield
    finally:
        INSIST.reset(token)


HOW_TO_INSIST = ("to run it anyway: `timerome --insist COMMAND ...`, TIMEROME_INSIST=1, or "
                 "`with timerome.common.checks.insisting():` in Python")


def budget(what: str, forwards: float, detail: str = "") -> None:
    """Refuse `what` when it needs more than FORWARD_LIMIT model forwards (unless insisting)."""
    if forwards <= FORWARD_LIMIT or insisting_now():
        return
    extra = f" ({detail})" if detail else ""
    raise TimeromeError(f"{what}: about {forwards:.3g} model forwards{extra}, more than the {FORWARD_LIMIT:.0e} "
                        f"timerome starts without being told: nothing was run; {HOW_TO_INSIST}")


def memory_budget(what: str, n_bytes: float, device=None) -> None:
    """Refuse `what` when it needs more memory than the device has free (unless insisting)."""
    free = available_memory(device)
    if free is None or n_bytes <= free or insisting_now():
        return
    where = "this machine's free memory" if device is None or str(device) == "cpu" else f"{device}'s free memory"
    raise TimeromeError(f"{what}: about {_bytes(n_bytes)} of memory, more than {where} ({_bytes(free)}): "
                        f"nothing was allocated; {HOW_TO_INSIST}")


def available_memory(device=None) -> int | None:
    """Bytes free on `device` (CPU: MemAvailable, within a cgroup limit; CUDA: free device memory);
    None when it cannot be told."""
    kind = str(device or "cpu").split(":")[0]
    if kind == "cuda":
        import torch

        try:
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            return int(free)
        except Exception:  # noqa: BLE001 - no CUDA, or a driver that cannot say
            return None
    if kind != "cpu":
        return None
    free = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        try:
            free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    for limit_file, used_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),):
        try:
            limit = open(limit_file, encoding="ascii").read().strip()
            if limit != "max":
                room = int(limit) - int(open(used_file, encoding="ascii").read().strip())
                free = room if free is None else min(free, room)
        except (OSError, ValueError):
            pass
    return free


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1024 or unit == "PB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.3g} PB"


def settings_object(value, what: str) -> None:
    """Settings given as an object of name -> value (None: none): a list, a JSON string or a number is refused as
    itself (dict() of it raised a bare TypeError or ValueError), as the command line's -c refuses it."""
    if value is not None and not isinstance(value, dict):
        raise TimeromeError(f"{what} must be a dict of setting -> value (e.g. {{\"alpha\": 2}}), got "
                            f"{type(value).__name__} {shown(value)}")
