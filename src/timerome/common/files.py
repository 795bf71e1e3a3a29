"""Files and text that users hand to timerome, and the files it hands back, each checked once.

Every failure here is a TimeromeError that names the file (or the option) and says what to do:
    read_text(path, "the rows file")      UTF-8 text; another encoding says where the bad byte is
    read_json(path, "config")             JSON, with the line and column of a syntax error; NaN / inf refused
    parse_json(text, "--config")          the same for JSON text given inline
    read_json_documents(path, "rows")     a JSON or JSON Lines file's documents, each read as parse_json reads
    user_text(text, "prompt 1")           a command-line string that is not UTF-8 (argv bytes)
    safetensors_error(path, e)            a truncated / foreign safetensors file, in words
    input_file(path, "edit memory file")  a file to read: there, not a directory, a regular file unless streamed
    path_arg(value, "save's path")        a Python argument that must be a path (str or os.PathLike)
    output_file(path, "--out")            a file to write: not a directory, its folder creatable
Nothing here writes: a check never changes a file the user gave.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from timerome.errors import TimeromeError


def path_arg(value, what: str) -> Path:
    """A path a Python caller gives (a str or an os.PathLike), as a Path; anything else one TimeromeError naming
    `what` (5 or a dict was a TypeError from deep inside pathlib)."""
    if not isinstance(value, (str, os.PathLike)):
        from timerome.common.checks import shown

        raise TimeromeError(f"{what} must be a path (a str or a pathlib.Path), got {type(value).__name__} "
                            f"{shown(value)}")
    return Path(value)


def input_file(path, what: str = "file", stream: bool = False) -> Path:
    """A file timerome will read: a missing path and a directory are each one clear error. stream: it
    is read once from start to end (text), so a pipe or terminal does too (`/dev/stdin`); else (tensor
    files, read by seeking or mapping) only a regular file does, where a pipe would block or fail."""
    if isinstance(path, str) and not path.strip():  # Path("") is ".", which read as "is a directory"
        raise TimeromeError(f"{what}: the path is empty: give a file")
    p = Path(path)
    if p == Path("."):  # "" made a Path early (a CLI option, a spec) is "." too
        raise TimeromeError(f"{what}: the path is empty (or '.', the current folder): give a file")
    if p.is_dir():
        raise TimeromeError(f"{what} {p} is a directory; pass a file")
    if not p.exists():
        raise TimeromeError(missing(what, p))
    if not stream and not p.is_file():
        raise TimeromeError(f"{what} {p} is not a regular file (a pipe or a device); save it to a file and pass that")
    return p


# what makes an input a user names but does not have yet: said where it is missing (review 79)
MAKES = {"edit memory file": "`timerome edit -o FILE` writes one (any memory: --method timerome, codebook, rewrite)",
         "edit request file": "`timerome requests SPEC -o FILE` writes one (SPEC e.g. counterfactual:forget10), or "
                              "give the spec itself"}


# a missing input named like this was most likely a value given to an on/off flag before it (`info --json true`)
FLAG_WORDS = ("true", "false", "yes", "no", "on", "off")


def flag_word(path) -> str:
    """What to add to a missing input's error when its name is one of FLAG_WORDS: flags take no value."""
    return (f" ({str(path)!r} reads as an on/off value, not a name: an on/off flag such as --json takes none, "
            f"write --json, not --json {path})" if str(path).lower() in FLAG_WORDS else "")


def missing(what: str, path) -> str:
    """The one-line error of an input file that is not there, with how to make it where `MAKES` knows."""
    return f"{what} {path} does not exist" + (flag_word(path) or (f": {MAKES[what]}" if what in MAKES else ""))


def read_text(path, what: str = "file") -> str:
    """The file's text as UTF-8 (a byte-order mark dropped); a missing file, a folder or another encoding is
    one clear error."""
    p = input_file(path, what, stream=True)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise TimeromeError(missing(what, p)) from None
    except OSError as e:
        raise TimeromeError(f"cannot read {what} {p}: {e.strerror or e}") from None
    try:  # a leading byte-order mark (what Windows editors write) marks the encoding: it is not text
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        if _is_safetensors(data):  # converting it would not help: it is another kind of file
            raise TimeromeError(f"{what} {p} is a safetensors file (an edit memory, a trace or a model's weights), "
                                f"not text: pass the {what} itself") from None
        line = data[: e.start].count(b"\n") + 1
        raise TimeromeError(f"{what} {p} is not UTF-8 text: byte 0x{data[e.start]:02x} at line {line} "
                            f"(byte offset {e.start}); convert it to UTF-8 (e.g. iconv -t UTF-8)") from None


def _is_safetensors(data: bytes) -> bool:
    """Whether bytes begin as a safetensors file does: an 8-byte little-endian header length, then its JSON."""
    if len(data) < 10 or data[8:9] != b"{":
        return False
    return 2 <= int.from_bytes(data[:8], "little") <= len(data) - 8


def read_json(path, what: str = "file", *, finite: bool = True, keys_once: bool = True):
    """The JSON document in the file (read_text's checks first); `finite`: NaN and Infinity, which
    Python's json reads although JSON has no such numbers, are refused naming where they are; `keys_once`
    (`parse_json`): False for files made elsewhere that other readers accept as json does (a checkpoint's)."""
    return parse_json(read_text(path, what), f"{what} {path}", finite=finite, keys_once=keys_once)


class _RepeatedKey(Exception):
    pass


def _once(pairs: list) -> dict:
    """An object's keys, each once: json keeps the last of two values without a word."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise _RepeatedKey(k)
        out[k] = v
    return out


def parse_json(text: str, what: str, *, finite: bool = True, keys_once: bool = True):
    """The JSON document in `text` (`what` names it in messages), NaN / inf refused when `finite`, a key an object
    gives twice refused when `keys_once` (`{"alpha": 2, "alpha": 3}` read as alpha 3: what a user writes for
    timerome; a checkpoint's files, which transformers reads as json does, keep json's last value)."""
    try:
        return _decode(text, what, finite, keys_once)
    except json.JSONDecodeError as e:
        raise TimeromeError(f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise TimeromeError(f"{what} nests its JSON too deeply to read") from None


def _decode(text: str, what: str, finite: bool = True, keys_once: bool = True):
    """`parse_json` but for its syntax errors, which pass as json.JSONDecodeError / RecursionError (a caller that
    tries another reading of the text, JSON Lines, decides what they mean)."""
    from timerome.common.checks import nonfinite_path

    try:
        doc = json.loads(text, object_pairs_hook=_once if keys_once else None)
    except _RepeatedKey as e:
        raise TimeromeError(f"{what} gives the key {e.args[0]!r} twice in one object (the second would replace the "
                            "first without a word): give it once") from None
    bad = nonfinite_path(doc) if finite else None
    if bad:
        raise TimeromeError(f"{what}: {bad} is NaN or infinite, which is not a JSON number and not a usable value; "
                            "write a finite number")
    return doc


def read_json_documents(path, what: str = "file") -> list:
    """The documents of a JSON or JSON Lines file, as a list: one JSON document (an array: its items; anything
    else: itself), or one per non-blank line. Each document is read as `parse_json` reads (a key given twice and
    NaN / inf refused, naming the line); an empty file is refused: an interrupted copy is not an empty list.
    The one reader of every rows and records file (TOFU splits, benchmarks, --data, edit requests)."""
    text = read_text(path, what)
    if not text.strip():
        raise TimeromeError(f"{what} {path} is empty: nothing in it (an interrupted copy?)")
    try:  # each text is decoded once: the whole, then (where it is no one document) each line
        doc = _decode(text, f"{what} {path}")
    except (json.JSONDecodeError, RecursionError) as e:
        whole = e  # not one JSON document: JSON Lines
    except TimeromeError:  # a key twice, met before the decoder knew: in one document, or a record of JSON Lines
        try:
            json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            whole = e  # JSON Lines: its line says it, with its number
        else:
            raise
    else:
        return doc if isinstance(doc, list) else [doc]
    docs = []
    # JSON Lines end a line at "\n" alone (a trailing "\r" is JSON whitespace): str.splitlines would also break
    # inside a string at U+2028, U+0085 or a form feed, which json.dumps(ensure_ascii=False) writes as they are
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            docs.append(_decode(line, f"{what} {path} line {lineno}"))
        except json.JSONDecodeError as e:
            if not docs and isinstance(whole, json.JSONDecodeError):  # not JSON Lines either: the one document's
                e, lineno = whole, whole.lineno                        # own error, where it is (a trailing comma)
            raise TimeromeError(f"{what} {path} line {lineno} is not JSON ({e.msg}; column {e.colno}): "
                                "give one JSON document, or one per line (JSON Lines)") from None
        except RecursionError:
            raise TimeromeError(f"{what} {path} line {lineno} nests its JSON too deeply to read") from None
    return docs


def user_text(text: str, what: str) -> str:
    """A string from the command line: argv bytes that are not UTF-8 arrive as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start].encode("utf-8", "surrogateescape")
        raise TimeromeError(f"{what} is not UTF-8 text: byte 0x{bad[0]:02x} at character {e.start}; "
                            "pass it in UTF-8") from None
    return text


def safetensors_error(path, error: Exception) -> TimeromeError:
    """What a safetensors read error means for the user (a truncated download, another format)."""
    p = Path(path)
    size = p.stat().st_size if p.is_file() else 0
    detail = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
    return TimeromeError(f"{p} is not a complete safetensors file ({size} bytes; {detail}): it is truncated "
                         "or damaged; copy or download it again")


def not_an_input(path, inputs: dict | None, what: str = "--out") -> None:
    """Refuse an output that is one of the command's inputs ({flag: path}, None where not given): writing
    there would replace the file (or the model folder) the user gave."""
    p = Path(path)
    flag = given_as(p, inputs)
    if flag is not None:
        raise TimeromeError(f"{what} {p} is the {flag} you gave: writing there would replace it; give another {what}")


def given_as(path, inputs: dict | None) -> str | None:
    """The flag of `inputs` ({flag: path}, None where not given) that names the file or folder at `path`, or
    None (a spec that is no path, or nothing there, names nothing)."""
    p = Path(path)
    for flag, given in (inputs or {}).items():
        if given is None or not Path(str(given)).exists() or not p.exists():
            continue
        try:
            if os.path.samefile(p, str(given)):
                return flag
        except OSError:
            continue
    return None


def output_file(path, what: str = "--out", example: str = "forget.safetensors", inputs: dict | None = None) -> Path:
    """A file timerome will write: refused up front if it is a directory (the message suggests
    DIR/example), its folder cannot be made, or it is one of the command's `inputs` ({flag: path})."""
    if isinstance(path, str) and not path.strip():  # Path("") is "."
        raise TimeromeError(f"{what}: the path is empty: give one")
    p = Path(path)
    if p == Path("."):  # "" made a Path early is "." too
        raise TimeromeError(f"{what}: the path is empty (or '.', the current folder): give a file name, e.g. {example}")
    not_an_input(p, inputs, what)
    if p.is_dir():
        raise TimeromeError(f"{what} {p} is a directory; pass a file name, e.g. {p / example}")
    folder = p.parent if str(p.parent) else Path(".")
    if folder.exists() and not folder.is_dir():
        raise TimeromeError(f"{what} {p}: {folder} is a file, not a folder")
    _writable(folder, what, p)
    return p


def output_folder(path, what: str = "--out", inputs: dict | None = None) -> Path:
    """A folder timerome will write into: refused up front if it is a file, cannot be made, or is one of
    the command's `inputs` ({flag: path}: the model's own folder)."""
    if isinstance(path, str) and not path.strip():  # Path("") is "."
        raise TimeromeError(f"{what}: the path is empty: give one")
    p = Path(path)
    not_an_input(p, inputs, what)
    if p.exists() and not p.is_dir():
        raise TimeromeError(f"{what} {p} is a file; pass a folder")
    _writable(p, what, p)
    return p


def _writable(folder: Path, what: str, target: Path) -> None:
    existing = folder
    while not existing.exists():  # the first folder that exists must let us create the rest
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing != folder and existing.exists() and not existing.is_dir():  # found before the run, not after it
        raise TimeromeError(f"{what} {target}: {existing} is a file, so no folder can be made in it; choose another "
                            "place")
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise TimeromeError(f"{what} {target}: {existing} is not writable; choose another place")


def refuse_inputs_among(files, inputs: dict | None, what: str = "--out") -> None:
    """Refuse where one of `files` (what a run writes or removes in its output folder) is one of the command's
    inputs ({flag: path}, None where not given, a spec that is no file skipped): the run would delete or replace
    the file the user gave."""
    for f in map(Path, files):
        flag = given_as(f, inputs)
        if flag is not None:
            raise TimeromeError(f"{flag} {inputs[flag]} is {f.name} in {what} {f.parent}, a file this command writes "
                                f"there (an earlier run's is removed): give another {what}, or move the file")


def drop_earlier(folder, earlier, writes=(), inputs: dict | None = None) -> None:
    """Remove an earlier run's files from an output folder before this run's are written, so that the folder
    never holds files of two runs as if they were one (a run stopped between its writes, or one that writes
    fewer files than the last): `earlier` the files (paths) a run of this command may write there, `writes`
    the ones this run writes (relative to `folder`, "/"-separated). Only those names are removed, never other
    files; a symbolic link under a name this run writes is kept, as the write goes through it to its target,
    and any other link is removed, never its target. `inputs` ({flag: path}): refused, not removed, where one
    of them is among `earlier` (`refuse_inputs_among`)."""
    folder = Path(folder)
    earlier = [Path(f) for f in earlier]
    refuse_inputs_among(earlier, inputs)  # never an input the user gave, whatever its name
    for f in earlier:
        try:
            if f.is_symlink():
                if f.relative_to(folder).as_posix() not in writes:
                    f.unlink()
            elif f.is_file():
                f.unlink()
        except OSError as e:
            raise TimeromeError(f"{f} (an earlier run's file) cannot be replaced: {e}") from None
