"""Which edit memory a saved file holds, and loading it as that memory.

Three memories are saved by timerome (each a `base.Memory`), told apart by the `format` in the file's header: the paper's
ridge memory (`edit_memory.EditMemory`, Eq. multifact), the radius-gated codebook memory
(`codebook_memory.CodebookMemory`) and the rewrite memory (`rewrite_memory.RewriteMemory`), both
beyond the paper. All have a coordinate, an alpha, facts (each with its own target, when it has
one) and an `applied(backbone)` context, so whatever applies one applies the others:
`timerome generate --edit`, `timerome eval --edit`, `timerome memory ...`, the lm-eval model.

Changing a saved memory is a read, a change and an atomic write; `changing(path)` makes the three
one at a time per file across processes (`lock.hold` on a hidden `.NAME.lock` beside it, removed
when done), so two
`timerome memory add` on one file never lose each other's facts: the second waits for the first
(or, with wait=False, is refused naming it) and then reads what the first wrote. Every read takes
the file in one piece (`cache.read_tensors`), so a read outside the lock, while the other renames
its new version into place, sees one version or the other, whole.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from timerome.common.cache import through_link
from timerome.common.files import path_arg
from timerome.common.lock import hold
from timerome.memory.base import KINDS, Memory, read_file


def _memory_classes() -> dict[str, type]:
    """format -> memory class: every module of this package is imported once, so each memory class has
    registered its formats (`base.KINDS`) without a list of them here."""
    import timerome.memory as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")
    return KINDS


def read_memory_file(path) -> tuple[dict, dict]:
    """(tensors, metadata) of any kind of memory file, its format and checksum checked."""
    return read_file(path, formats=tuple(_memory_classes()))


def memory_class(meta: dict) -> type:
    """The memory class a header's format names (the paper's ridge memory for an unknown one: its loader
    then says what is wrong with the file)."""
    from timerome.memory.edit_memory import EditMemory

    fmt = meta.get("format")
    return _memory_classes().get(fmt, EditMemory) if isinstance(fmt, str) else EditMemory


def memory_kind(meta: dict) -> str:
    """'edit' (the paper's ridge memory), 'codebook' or 'rewrite', from a header."""
    return memory_class(meta).KIND


def file_class(path) -> type:
    """The memory class a file's header names: its header alone is read (no tensors, no checksum); a
    file that cannot be read gives the paper's ridge memory, whose loader then says what is wrong with it."""
    from timerome.common.cache import timerome_header

    return memory_class(timerome_header(path))  # {}: missing, truncated, foreign: EditMemory.load says which


def kinds_taking(option: str) -> list[str]:
    """The kinds of memory whose loader takes `option` (a LOAD_OPTIONS name: 'calibration', 'value_rows')."""
    return sorted({c.KIND for c in _memory_classes().values() if option in c.LOAD_OPTIONS})


def file_kind(path) -> str:
    """'edit', 'codebook' or 'rewrite': the kind of memory a file's header says (see file_class)."""
    return file_class(path).KIND


def load_memory(path, backbone, calibration=None, value_rows=None) -> Memory:
    """The memory saved at `path`, for `backbone` (another model's file, a damaged one or an unknown
    format is one TimeromeError). `calibration`: a codebook or rewrite memory's radius corpus, and
    `value_rows` a rewrite memory's token-value rows (default: those its file records its build read
    them on, else those its method reads them on, `RewriteMemory._restore`), needed only to insert
    more facts into it (each memory takes the ones of its LOAD_OPTIONS)."""
    path = path_arg(path, "load_memory's path (the memory file)")
    cls = file_class(path)
    given = {"calibration": calibration, "value_rows": value_rows}
    return cls.load(path, backbone, **{k: v for k, v in given.items() if k in cls.LOAD_OPTIONS})


def lock_path(path) -> Path:
    """The lock file of a memory file: hidden, beside it (beside its target, for a link: where the writes land)."""
    p = through_link(path)
    return p.with_name(f".{p.name}.lock")


def changing(path, *, wait: bool | float = True):
    """Hold the memory file at `path` for a read-change-write (`with changing(path): load, change,
    save`): another process changing it waits, or with wait=False is refused naming the holder."""
    return hold(lock_path(path), wait=wait, what=f"the memory file {path}", remove=True)

