"""MUSE (Machine Unlearning Six-way Evaluation) evaluation splits: Books (Harry Potter) and News (BBC).

    load_muse("books", "knowmem/forget_qa", source)  -> Loaded rows {"question", "answer"}
    load_muse("news", "verbmem/forget", source)       -> rows {"prompt", "gt"}
    load_muse("news", "privleak/holdout", source)     -> rows {"text"}

Local layout: `<corpus>/<subset>/<split>.json` under the MUSE folder, each a JSON array; the corpus
folder is `books/` or `news/`, or as the original repository names them under `data/`, `hp/` (Books)
or `bbc/` (News). The corpus folder itself may be given instead, when its name is the corpus asked
for (or one that names no corpus): a Books folder is never read as News. Its June-2024 copy
names the retain split `retain2_qa` / `retain2`, the Hub release `retain_qa` / `retain`: both are
read. Hub: `muse-bench/MUSE-Books` and `muse-bench/MUSE-News`, config = subset, split = split.
MUSE-Books is copyrighted text: it is read where the user keeps it and never copied.
"""

from __future__ import annotations

from timerome.data.benchmark import Loaded, bench_dir, find_file, from_hub, keep, read_file, text_fields
from timerome.errors import TimeromeError

HUB = {"books": "muse-bench/MUSE-Books", "news": "muse-bench/MUSE-News"}
FOLDERS = {"books": ("books", "hp"), "news": ("news", "bbc")}  # a corpus's folder names, ours then the repository's
# part -> (local file names, first found; Hub split; the row kind)
PARTS = {
    "knowmem/forget_qa": (("forget_qa.json",), "forget_qa", "qa"),
    "knowmem/forget_qa_icl": (("forget_qa_icl.json",), "forget_qa_icl", "qa"),
    "knowmem/retain_qa": (("retain_qa.json", "retain2_qa.json"), "retain_qa", "qa"),
    "knowmem/retain_qa_icl": (("retain_qa_icl.json", "retain2_qa_icl.json"), "retain_qa_icl", "qa"),
    "verbmem/forget": (("forget.json",), "forget", "verbatim"),
    "privleak/forget": (("forget.json",), "forget", "text"),
    "privleak/holdout": (("holdout.json",), "holdout", "text"),
    "privleak/retain": (("retain.json", "retain2.json"), "retain", "text"),
}
FIELDS = {"qa": ("question", "answer"), "verbatim": ("prompt", "gt"), "text": ("text",)}


def load_muse(corpus: str, part: str, source=None) -> Loaded:
    """The rows of one MUSE split (module docstring); unusable rows are reported, not dropped."""
    if corpus not in HUB:
        raise TimeromeError(f"unknown MUSE corpus {corpus!r}; choose books or news")
    if part not in PARTS:
        raise TimeromeError(f"unknown MUSE split {part!r}; splits: {', '.join(PARTS)}")
    names, hub_split, kind = PARTS[part]
    subset = part.split("/")[0]
    name = f"MUSE-{corpus.capitalize()} {part}"
    root = bench_dir(source, "muse")
    if root is None:
        raw, where = from_hub(HUB[corpus], subset, hub_split), HUB[corpus]
    else:
        base = corpus_folder(root, corpus)
        path = find_file(base, tuple(f"{subset}/{n}" for n in names), name)
        raw, where = read_file(path), str(path)
    return keep(name, raw, lambda r: _row(r, kind), where)


def corpus_folder(root, corpus: str):
    """The folder of `corpus` under `root` (FOLDERS), else `root` itself unless its name is the other
    corpus's: MUSE-News scored on Harry Potter text would be labelled News, silently."""
    for name in FOLDERS[corpus]:
        if (root / name).is_dir():
            return root / name
    other = next(c for c in FOLDERS if c != corpus)
    if root.name.lower() in FOLDERS[other]:
        raise TimeromeError(f"{root} is the MUSE-{other.capitalize()} folder, and MUSE-{corpus.capitalize()} was "
                            f"asked for: pass the folder holding {'/ or '.join(FOLDERS[corpus])}/ (or that folder)")
    return root


def _row(row, kind: str):
    if kind == "text" and isinstance(row, str):  # the repository's privleak files: a list of passages
        row = {"text": row}
    return text_fields(row, FIELDS[kind])
