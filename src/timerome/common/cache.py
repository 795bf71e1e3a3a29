"""The one cache helper: where cached things live, how they are named, how they are written.

Everything timerome caches is a pure function of its inputs (model fingerprint, data, settings),
so an entry is named by `digest(inputs)` and never goes stale; deleting the folder only costs
recomputation. Root: $TIMEROME_CACHE, else ~/.cache/timerome. Writes are atomic with a unique
temporary name, so concurrent writers never share a file and a reader never sees half of one; and
one process makes a tensor entry while another that needs it waits and reads it (`cached_tensors`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import uuid
from contextlib import ExitStack
from pathlib import Path

VERSION = 2  # part of every digest: bump when a cached thing's meaning changes


def cache_dir() -> Path:
    return Path(os.environ.get("TIMEROME_CACHE") or Path.home() / ".cache" / "timerome")


def digest(obj, n: int = 20, *, versioned: bool = True) -> str:
    """A stable short hash of anything JSON can write (sets/tuples as lists, the rest by str); a cache
    key's includes VERSION, one saved in a file (versioned=False) does not, so it survives a bump."""
    text = json.dumps(obj, sort_keys=True, default=_jsonable)
    return hashlib.sha256((f"v{VERSION}:{text}" if versioned else text).encode()).hexdigest()[:n]


def _jsonable(x):
    import numpy as np

    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def temp_name(path: Path) -> Path:
    """A temporary name beside `path` that no other writer (process or thread) uses."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def through_link(path) -> Path:
    """Where a write to `path` lands: a symbolic link's target (the rename that makes a write atomic
    would otherwise replace the link with a file and leave its target as it was)."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _discard(tmp: Path) -> None:
    """Remove a temporary file if it is there (where its folder could not be made, e.g. a file stands
    in the way, unlink's own NotADirectoryError must not hide the write's error)."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def write_atomic(path, data: str | bytes) -> Path:
    """Write `data` to `path` all at once (a temporary file renamed into place; through a link, its target)."""
    path = through_link(path)
    tmp = temp_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        tmp.replace(path)
    except OSError as e:
        raise _unwritten(path, e) from None
    finally:
        _discard(tmp)
    return path


def _unwritten(path: Path, e: OSError):
    """A write that failed (a full disk, a quota, a vanished folder, a directory in the way, no
    permission), in words: what is and is not there, and what to do about it."""
    import errno

    from timerome.errors import TimeromeError

    if e.errno == errno.EISDIR or path.is_dir():
        return TimeromeError(f"could not write {path}: it is a directory; give a file name (e.g. {path / 'out'})")
    kept = "left as it was" if path.exists() else "not created"
    advice = next((text for codes, text in (
        ((errno.ENOSPC, errno.EDQUOT), "free some space (or choose another place)"),
        ((errno.ENOENT,), f"the folder {path.parent} could not be made or is gone; choose another place"),
        ((errno.EACCES, errno.EPERM), "there is no permission to write there; choose another place"),
        ((errno.EROFS,), "that file system is read-only; choose another place")) if e.errno in codes),
        "choose another place")
    return TimeromeError(f"could not write {path}: {e.strerror or e}; {path.name} is {kept} and nothing half-written "
                         f"is left; {advice} and run the command again")


def plain(x, marks: list | None = None, at: tuple = ()):
    """x with numpy / torch numbers, tuples, sets and paths as JSON values, non-finite floats as None:
    what standard JSON (RFC 8259, which has no NaN or Infinity) can hold, and strict parsers read.
    marks: a list that takes [key or index, ..., "nan" | "inf" | "-inf"] for each non-finite float
    written as None (its path from x, `at` before it), so that a reader of the file can put it back
    (`restore_nonfinite`) where null alone would not say it was a number."""
    if isinstance(x, dict):
        return {str(k): plain(v, marks, at if marks is None else (*at, str(k))) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [plain(v, marks, at if marks is None else (*at, i)) for i, v in enumerate(x)]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # numpy / torch values and arrays
        return plain(x.tolist(), marks, at)
    if isinstance(x, float):
        if math.isfinite(x):
            return x
        if marks is not None:
            marks.append([*at, repr(float(x))])
        return None
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)


def json_text(obj, marks: list | None = None) -> str:
    """obj as standard JSON text (`plain`: NaN and infinities as null, listed in marks where given),
    indented, with a final newline: every JSON file timerome writes and every --json it prints."""
    return json.dumps(plain(obj, marks), indent=2, allow_nan=False) + "\n"


def write_json(path, obj) -> Path:
    return write_atomic(path, json_text(obj))


def restore_nonfinite(x, marks: list):
    """x (read back from JSON) with the values `plain(..., marks)` listed put back in place of their nulls."""
    for *path, value in marks:
        node = x
        for k in path[:-1]:
            node = node[k]
        if node[path[-1]] is not None:
            raise ValueError(f"non-finite mark {path} does not point at a null")
        node[path[-1]] = float(value)
    return x


def _file_mode() -> int:
    """The mode a plain new file gets under this process's umask (0644 under the usual 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def save_tensors(path, tensors: dict, metadata: dict | None = None) -> Path:
    """safetensors written atomically (through a link, to its target)."""
    from safetensors.torch import save_file

    path = through_link(path)
    tmp = temp_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        os.chmod(tmp, _file_mode())  # safetensors creates 0600; a saved file is as readable as any other
        tmp.replace(path)
    except OSError as e:
        raise _unwritten(path, e) from None
    except Exception as e:  # noqa: BLE001 - safetensors reports a failed write as its own error type
        if type(e).__name__ == "SafetensorError" and "I/O error" in str(e):
            raise _unwritten(path, OSError(str(e).split("I/O error: ", 1)[-1])) from None
        raise
    finally:
        _discard(tmp)
    return path


def file_sha256(path) -> str:
    """sha256 of a file's bytes, read in blocks (a GGUF file's cache name, the embedded weights' record)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def tensors_digest(tensors: dict) -> str:
    """sha256 of named tensors: each one's name, dtype, shape and every byte, in name order (a memory file's
    checksum, a trace's pair stamp)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def read_tensors(path) -> tuple[dict, dict]:
    """(tensors, metadata) of a safetensors file, read in one piece: the bytes of one open file, so a
    file replaced meanwhile (`save_tensors` renames a new version into place) gives this version or
    the next, never a mix. safetensors' own reader maps the file again by its name for the tensors:
    a version renamed in between gives the old header over the new bytes (measured: 1,333 of 23,490
    reads of a file rewritten in a loop had tensors that did not match their header). For files a
    user or another process may change while they are read (memories, caches, traces, training
    states); a model's checkpoint is mapped as safetensors maps it (no copy in memory)."""
    from safetensors.torch import load

    data = Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not data:
        raise ValueError("not a safetensors file: the file is empty")
    if not 0 <= n <= len(data) - 8:
        raise ValueError(f"not a safetensors file: {len(data)} bytes, too short for the header they announce"
                         if n >= 0 else f"not a safetensors file: {len(data)} bytes, shorter than a header")
    header = json.loads(data[8:8 + n])
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return load(data), dict(meta or {})


def header_metadata(path) -> dict:
    """The metadata of a safetensors file, read from its header alone (not the tensors, which may be GBs)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return dict(f.metadata() or {})


def timerome_header(path) -> dict:
    """The "timerome" header a .safetensors file of ours carries (its header alone read), or {} for anything else:
    no regular file (a pipe's open would block), not safetensors, no such header, a header not a JSON object."""
    if not Path(path).is_file():
        return {}
    try:
        header = json.loads(header_metadata(path).get("timerome", "{}"))
    except Exception:  # noqa: BLE001 - truncated, foreign, not JSON: nothing of ours to read
        return {}
    return header if isinstance(header, dict) else {}


def cached_tensors(kind: str, key, make, *, enabled: bool = True) -> dict:
    """{name: tensor} made by make() once per key, then read from <cache>/<kind>/<digest>.safetensors.

    Made by one process at a time: the entry's lock (`lock.hold`, removed when done) makes a second
    process (or thread) that needs the same entry meanwhile wait and read what the first made, not
    make it again (the workers of a parallel experiment, or two commands, start with the same
    calibration). Where the lock cannot be taken (a cache folder that cannot be made), the entry is
    made unlocked, and writing it says what is wrong."""
    path = cache_dir() / kind / f"{digest(key)}.safetensors"
    if not enabled:
        return make()

    def made() -> dict:
        tensors = make()
        save_tensors(path, tensors)
        return tensors

    return made_once(path, f"the cache entry {kind}/{path.stem}",
                     lambda: read_tensors(path)[0] if path.is_file() else None, made)


def made_once(path, what: str, read, make):
    """The cache entry at `path`: read() where it is there (read returns None where it is not), else
    make() (which writes it) under the entry's lock (`entry_lock`), read() once more when the lock is
    held: a process that waited for another one making it reads what that one made."""
    got = read()
    if got is not None:
        return got
    with entry_lock(path, what):
        got = read()  # made while this one waited
        return make() if got is None else got


def entry_lock(path, what: str) -> ExitStack:
    """The lock of the cache entry at `path` (a file or folder; the lock file `path`.lock beside it,
    removed when done), held until the returned stack is closed: `with entry_lock(path, what):`,
    then look again whether the entry is there (another process may have made it meanwhile) before
    making it, as `made_once` does for one entry. `what` names it to a process that waits. Nothing is
    held where the lock file cannot be made (a cache folder that cannot be written): the entry's own
    write then says what is wrong."""
    from timerome.common.lock import hold

    path = Path(path)
    stack = ExitStack()
    try:
        stack.enter_context(hold(path.with_name(path.name + ".lock"), what=what, remove=True))
    except OSError:
        pass
    return stack
