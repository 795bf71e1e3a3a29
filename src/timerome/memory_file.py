"""Which edit memory a saved file holds, and loading it as that memory.

Three memories are saved by timerome, told apart by the `format` in the file's header: the paper's
ridge memory (`edit_memory.EditMemory`, Eq. multifact), the radius-gated codebook memory
(`codebook_memory.CodebookMemory`) and the rewrite memory (`rewrite_memory.RewriteMemory`), both
beyond the paper. All have a coordinate, an alpha, facts (each with its own target, when it has
one) and an `applied(backbone)` context, so whatever applies one applies the others:
`timerome generate --edit`, `timerome eval --edit`, `timerome memory ...`, the lm-eval model.

Changing a saved memory is a read, a change and an atomic write; `changing(path)` makes the three
one at a time per file across processes (`lock.hold` on a hidden `.NAME.lock` beside it, removed
when done), so two
`timerome memory add` on one file never lose each other's facts: the second waits for the first
(or, with wait=False, is refused naming it) and then reads what the first wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from timerome.codebook_memory import FORMAT as CODEBOOK_FORMAT, CodebookMemory
from timerome.edit_memory import FORMAT, OLD_FORMATS, EditMemory, read_file
from timerome.edit_memory import sort_new_facts  # noqa: F401 - the CLI takes it from here
from timerome.lock import hold
from timerome.rewrite_memory import FORMAT as REWRITE_FORMAT, RewriteMemory

FORMATS = (FORMAT, *OLD_FORMATS, CODEBOOK_FORMAT, REWRITE_FORMAT)
KINDS = {FORMAT: "edit", CODEBOOK_FORMAT: "codebook", REWRITE_FORMAT: "rewrite",
         **{f: "edit" for f in OLD_FORMATS}}


def read_memory_file(path) -> tuple[dict, dict]:
    """(tensors, metadata) of either kind of memory file, its format and checksum checked."""
    return read_file(path, formats=FORMATS)


def memory_kind(meta: dict) -> str:
    """'edit' (the paper's ridge memory), 'codebook' or 'rewrite', from a header."""
    return KINDS.get(meta.get("format"), "edit")


def file_kind(path) -> str:
    """The memory kind a file's header says: its header alone is read (no tensors, no checksum); a
    file that cannot be read says 'edit', and the loader then says what is wrong with it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return memory_kind(json.loads((f.metadata() or {})["timerome"]))
    except Exception:  # noqa: BLE001 - missing, truncated, foreign: EditMemory.load reports it in one line
        return "edit"


def is_codebook_file(path) -> bool:
    return file_kind(path) == "codebook"


def load_memory(path, backbone, calibration=None, value_rows=None):
    """The memory saved at `path`, for `backbone` (another model's file, a damaged one or an unknown
    format is one TimeromeError). `calibration`: a codebook or rewrite memory's radius corpus, and
    `value_rows` a rewrite memory's token-value rows, needed only to insert more facts into it."""
    kind = file_kind(path)
    if kind == "rewrite":
        return RewriteMemory.load(path, backbone, calibration=calibration, value_rows=value_rows)
    if kind == "codebook":
        return CodebookMemory.load(path, backbone, calibration=calibration)
    return EditMemory.load(path, backbone)


def lock_path(path) -> Path:
    """The lock file of a memory file: hidden, beside it."""
    p = Path(path)
    return p.with_name(f".{p.name}.lock")


def changing(path, *, wait: bool | float = True):
    """Hold the memory file at `path` for a read-change-write (`with changing(path): load, change,
    save`): another process changing it waits, or with wait=False is refused naming the holder."""
    return hold(lock_path(path), wait=wait, what=f"the memory file {path}", remove=True)

