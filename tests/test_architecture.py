"""The architecture docs/ARCHITECTURE.md promises, checked on the source itself (an AST walk of every
import, function-level ones included):

- imports only go down the layers of LAYERS (a package may import itself and anything below it,
  nothing beside or above it);
- no import cycle between modules;
- every torch hook is registered in engine/hooks.py (`Hooks`), nowhere else in the package or the
  benchmarks;
- no module outside backbones/ compares a family's name with a literal (a flag of the family's table instead);
- the benchmarks import the installed package only: no sys.path changes, nothing from tests/, no
  benchmark imports another;
- at most a dozen modules at the top of the package;
- a default of the typed settings (engine/settings.py: SAMPLER, LIKELIHOOD, TRACE, EDIT, LOCALITY) is written
  there only:
  no parameter default, typer.Option default, `.get(name, default)` or keyword of a CONFIG repeats its
  literal (another value, e.g. n_mc=0 for "no likelihood", is a choice, not a repeat);
- no module-level mutable state outside the registries: no `global` statement, no module-level
  container a function changes, no lru_cache, but for the names in REGISTRIES and MEMOS (context-scoped
  state lives in ContextVars: --insist, the open progress display, the locks a context holds).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "timerome"

# bottom to top; packages on one row are siblings and may not import each other
LAYERS = [
    ("errors",),
    ("common",),
    ("data",),
    ("backbones",),
    ("engine",),
    ("tracing", "memory", "training"),
    ("metrics",),
    ("methods",),
    ("evaluation",),
    ("integrations",),
    ("experiments",),
    ("demo",),
    ("cli",),
    ("__main__",),
]
RANK = {name: i for i, row in enumerate(LAYERS) for name in row}
HOOK_CALLS = {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
              "register_full_backward_pre_hook", "register_backward_hook", "register_module_forward_hook",
              "register_module_forward_pre_hook", "register_module_full_backward_hook", "register_hook"}


# module-level containers that functions may change: the registries (a method, a data kind, a measurement,
# a memory file format registers itself) and the methods registry's "every method file imported" flag
REGISTRIES = {"methods/registry.py": {"METHODS", "_loaded"}, "experiments/runner.py": {"DATA_KINDS", "MEASURES"},
              "metrics/columns.py": {"COLUMNS"},
              "memory/base.py": {"TENSORS", "KINDS"}}
# memos of a constant, never observable: the embedded corpus (a pure function of nothing, handed out only as a
# deep copy or a new list by its own module, test_the_memo_is_private below; building it costs 40 ms and the
# evaluation asks for it often)
MEMOS = {"data/tofu.py": {"_embedded"}}
MUTATORS = {"append", "extend", "update", "add", "pop", "setdefault", "clear", "remove", "insert", "popitem",
            "discard", "sort", "reverse"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def resolve(name: str) -> str:
    """The module an imported name lives in: timerome.a.b.C -> timerome.a.b when that is a module."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES else ""


def imports(path: Path) -> list[tuple[str, int]]:
    """(module imported, line) for every timerome import in a file, at any depth of its code."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "timerome":
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "timerome"]
        else:
            continue
        out += [(resolve(n), node.lineno) for n in names]
    return [(m, line) for m, line in out if m]


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""  # "" = the package root (the public facade)


GRAPH = {m: imports(p) for m, p in MODULES.items()}


def test_every_package_has_a_layer():
    tops = {layer_of(m) for m in MODULES} - {""}
    assert tops <= set(RANK), f"packages / top modules with no layer in LAYERS: {sorted(tops - set(RANK))}"


def test_imports_only_go_down():
    bad = []
    for m, deps in GRAPH.items():
        a = layer_of(m)
        if not a:
            continue  # the root __init__: the lazy facade over every stage
        for dep, line in deps:
            b = layer_of(dep)
            if not b:
                bad.append(f"{MODULES[m].relative_to(ROOT)}:{line} imports the package root (import the module itself)")
            elif b != a and RANK[b] >= RANK[a]:
                bad.append(f"{MODULES[m].relative_to(ROOT)}:{line} imports {dep} ({a} -> {b}: not below)")
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    # Tarjan's strongly connected components over the module graph
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in GRAPH[v]:
            if w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def raw_hooks(path: Path) -> list[int]:
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Attribute) and node.attr in HOOK_CALLS]


def test_hooks_are_registered_only_by_the_hooks_module():
    files = [p for p in SRC.rglob("*.py") if p != SRC / "engine" / "hooks.py"] + sorted((ROOT / "benchmarks").glob("*.py"))
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in raw_hooks(p)]
    assert not bad, "raw torch hooks outside engine/hooks.py (use Hooks): " + ", ".join(bad)
    assert raw_hooks(SRC / "engine" / "hooks.py"), "the hooks module registers no hook: HOOK_CALLS is stale"


def family_tests(path: Path) -> list[int]:
    """Lines comparing a family's name with a literal (`backbone.family.name != "timerome"`, `fam.name in (...)`):
    a choice that belongs in the family's table (backbones/families.py) as a flag."""
    def names_family(node):
        return (isinstance(node, ast.Attribute) and node.attr == "name"
                and (isinstance(node.value, ast.Name) and node.value.id in ("family", "fam")
                     or isinstance(node.value, ast.Attribute) and node.value.attr == "family"))

    def literal(node):
        return isinstance(node, ast.Constant) and isinstance(node.value, str) or isinstance(
            node, (ast.Tuple, ast.List, ast.Set)) and all(isinstance(e, ast.Constant) for e in node.elts)

    return [node.lineno for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Compare) and any(names_family(a) for a in (node.left, *node.comparators))
            and any(literal(a) for a in (node.left, *node.comparators))]


def test_no_algorithm_file_names_a_family(tmp_path):
    """Adapters as data: outside backbones/ a family is read through its table's flags, never by its name."""
    files = [p for p in SRC.rglob("*.py") if "backbones" not in p.relative_to(SRC).parts]
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in family_tests(p)]
    assert not bad, "a family named outside backbones/ (give its table a flag): " + ", ".join(bad)
    caught = tmp_path / "caught.py"  # what stop 78 found in training/train.py, and its other spellings
    caught.write_text('a = bb.family.name != "timerome"\nb = fam.name in ("llada", "dream")\nc = "x" == family.name\n'
                      'd = bb.family.causal\ne = bb.name == "timerome-default"\n')
    assert family_tests(caught) == [1, 2, 3]


@pytest.mark.parametrize("bench", sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_import_the_installed_package_only(bench):
    text = bench.read_text(encoding="utf-8")
    siblings = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    tests = {p.stem for p in (ROOT / "tests").rglob("*.py")}
    bad = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            bad.append(f"line {node.lineno}: sys.path")
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for n in names:
            if n.split(".")[0] in (siblings | tests | {"tests"}):
                bad.append(f"line {node.lineno}: imports {n}")
    assert not re.search(r"PYTHONPATH", text), f"{bench.name} sets PYTHONPATH"
    assert not bad, f"{bench.name}: " + "; ".join(bad)


def test_at_most_a_dozen_top_level_modules():
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= 12, top


def test_the_docs_show_these_layers():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1]
    rows = [line for line in section.splitlines() if re.match(r"^\d+\. ", line)]
    shown = [tuple(re.findall(r"`([\w_]+)/?`", r)) for r in rows]
    assert shown == LAYERS, "docs/ARCHITECTURE.md's layer list differs from tests/test_architecture.py's LAYERS"


def module_state(path: Path) -> list[tuple[int, str, str]]:
    """(line, name, what) for each global statement, lru_cache / cache and change of a module-level container."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    containers = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        v = getattr(node, "value", None)
        if isinstance(v, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
                isinstance(v, ast.Call) and ast.unparse(v.func).split(".")[-1] in
                ("dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque")):
            containers |= {t.id for t in targets if isinstance(t, ast.Name)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            out += [(node.lineno, n, "global") for n in node.names]
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for d in node.decorator_list:
            text = ast.unparse(d)
            if "lru_cache" in text or text.split("(")[0].endswith("cache"):
                out.append((node.lineno, node.name, text))
        for sub in ast.walk(node):
            targets = sub.targets if isinstance(sub, (ast.Assign, ast.Delete)) else \
                [sub.target] if isinstance(sub, ast.AugAssign) else []
            for t in targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in containers:
                    out.append((sub.lineno, t.value.id, "item set"))
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in MUTATORS \
                    and isinstance(sub.func.value, ast.Name) and sub.func.value.id in containers:
                out.append((sub.lineno, sub.func.value.id, f".{sub.func.attr}()"))
    return out


def test_no_module_level_mutable_state_outside_the_registries():
    bad = []
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC).as_posix()
        allowed = REGISTRIES.get(rel, set()) | MEMOS.get(rel, set())
        bad += [f"{rel}:{line} {name} ({what})" for line, name, what in module_state(p) if name not in allowed]
    assert not bad, "module-level mutable state: " + ", ".join(bad)


def settings_defaults() -> dict[str, set]:
    """{field name: the default values the typed settings give it} (steps: the sampler's and the trace's)."""
    import dataclasses

    from timerome.engine import settings

    out: dict[str, set] = {}
    for obj in (settings.SAMPLER, settings.ANSWER, settings.LIKELIHOOD, settings.QUICK_LIKELIHOOD, settings.TRACE,
                settings.EDIT, settings.LOCALITY, settings.SMALL_LOCALITY):
        for f in dataclasses.fields(obj):
            out.setdefault(f.name, set()).add(getattr(obj, f.name))
    return out


def repeated_defaults(path: Path, defaults: dict[str, set]) -> list[tuple[int, str]]:
    """(line, name) where a literal equal to a settings default is written for a parameter of that name."""
    def literal(node):
        return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value is not None

    tree = ast.parse(path.read_text(encoding="utf-8"))
    configs = {id(n.value) for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and any(isinstance(t, ast.Name) and t.id.isupper() for t in n.targets)}  # CONFIG, QUICK, DEMO, ...
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + \
                [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            for arg, d in pairs:
                if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("Option") and d.args:
                    d = d.args[0]  # typer.Option(default, ...)
                if arg.arg in defaults and literal(d) and d.value in defaults[arg.arg]:
                    out.append((d.lineno, arg.arg))
        elif isinstance(node, ast.Call):
            f = ast.unparse(node.func)
            if f.endswith(".get") and len(node.args) == 2 and literal(node.args[0]) and literal(node.args[1]) \
                    and node.args[0].value in defaults and node.args[1].value in defaults[node.args[0].value]:
                out.append((node.lineno, node.args[0].value))
            for kw in node.keywords:  # an experiment's CONFIG / QUICK, a method's DEFAULTS, the demo's DEMO
                if id(node) in configs and kw.arg in defaults and literal(kw.value) and kw.value.value in defaults[kw.arg]:
                    out.append((kw.value.lineno, kw.arg))
    return out


def test_the_memo_is_private():
    """A memo is handed out by its own module only (copies): imported elsewhere, its one shared object could be
    changed by any caller (stop 78: four modules read the embedded corpus's memo directly)."""
    bad = []
    for path in SRC.rglob("*.py"):
        rel = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                owner = node.module.removeprefix("timerome.").replace(".", "/") + ".py"
                bad += [f"{rel}:{node.lineno} imports {a.name}" for a in node.names
                        if a.name in MEMOS.get(owner, ()) and owner != rel]
    assert not bad, "a memo imported outside its module (hand out a copy): " + ", ".join(bad)


def test_settings_defaults_are_written_once():
    defaults = settings_defaults()
    bad = [f"{p.relative_to(ROOT)}:{line} {name}" for p in sorted(SRC.rglob("*.py"))
           if p != SRC / "engine" / "settings.py" for line, name in repeated_defaults(p, defaults)]
    assert not bad, "a settings default written again (read it from engine/settings.py): " + ", ".join(bad)


def test_the_checks_catch_what_they_claim(tmp_path):
    """The walkers themselves: an upward import, a raw hook and a sys.path change are found."""
    f = tmp_path / "x.py"
    f.write_text("import sys\nfrom timerome.experiments import runner\ndef f(m):\n    m.register_forward_hook(None)\n"
                 "sys.path.insert(0, '.')\n")
    assert raw_hooks(f) == [4]
    g = tmp_path / "state.py"
    g.write_text("import functools\nSEEN = {}\nN = 0\ndef f(k):\n    global N\n    SEEN[k] = 1\n"
                 "@functools.lru_cache(maxsize=2)\ndef g():\n    return 1\n")
    assert sorted((line, name) for line, name, _ in module_state(g)) == [(5, "N"), (6, "SEEN"), (8, "g")]
    h = tmp_path / "defaults.py"
    h.write_text("def f(n_mc: int = 16, steps=0):\n    return dict(n_mc=16, steps=3), o.get('steps', 8)\n"
                 "def g(n_mc=typer.Option(16)):\n    pass\nCONFIG = dict(n_mc=16, steps=2)\n")
    assert sorted(repeated_defaults(h, settings_defaults())) == [(1, "n_mc"), (2, "steps"), (3, "n_mc"), (5, "n_mc")]
    assert ("timerome.experiments.runner", 2) in imports(f)
    assert resolve("timerome.engine.hooks.Hooks") == "timerome.engine.hooks"
    assert RANK["experiments"] > RANK["engine"]


def test_the_runner_names_no_method():
    """The experiments' runner computes any registered method's cells; a method's name appears in the
    experiment files that choose it, never in the runner (docstrings aside)."""
    from timerome.methods import available

    tree = ast.parse((SRC / "experiments" / "runner.py").read_text(encoding="utf-8"))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    names = set(available())
    found = [(n.lineno, n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and id(n) not in docs and n.value in names]
    assert not found, f"experiments/runner.py names methods: {found}"


def test_the_edit_commands_name_no_gated_method():
    """`timerome edit` and `memory add` build a codebook or rewrite memory as its method's `GatedBuild` says
    (registry data in the method's own file): no line compares the method with a name but the paper's ridge
    memory's (`cli.edit.RIDGE`, whose settings are the command's own options), help texts aside."""
    names = {"codebook", "rewrite", "random_layer"}
    found = []
    for rel, where in (("cli/edit.py", None), ("cli/app.py", None), ("cli/memory.py", "add")):
        tree = ast.parse((SRC / rel).read_text(encoding="utf-8"))
        if where is not None:  # `memory show` lays out each kind of file; `memory add` builds as the method does
            tree = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == where)
        for n in ast.walk(tree):
            if isinstance(n, ast.Compare):
                sides = [n.left, *n.comparators]
                consts = [c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)]
                if any(isinstance(s, ast.Name) and s.id in ("method", "kind") for s in sides) and names & set(consts):
                    found.append(f"{rel}:{n.lineno}")
    assert not found, "a gated method named in a comparison (give its GatedBuild the behaviour): " + ", ".join(found)


# the stage packages whose modules are the paper's concepts: each has tests/<package>/test_<module>.py, or
# is tested where it is used (COVERED_BY: that test file imports it and says so)
CONCEPT_PACKAGES = ("engine", "tracing", "memory")
COVERED_BY = {
    "tracing/wavefront.py": "tracing/test_causal_trace.py",  # the fast engine against the literal definition
    "tracing/result.py": "tracing/test_causal_trace.py",     # the trace's file: save, load, refuse
    "tracing/heatmaps.py": "tracing/test_causal_trace.py",   # the figures of a trace
    "memory/token_keys.py": "memory/test_codebook_memory.py",  # the codebook's keys and states
    "memory/memory_file.py": "memory/test_base.py",          # any saved memory, through the registry
}


def test_every_concept_module_has_its_tests():
    missing = []
    for pkg in CONCEPT_PACKAGES:
        for p in sorted((SRC / pkg).glob("*.py")):
            if p.name == "__init__.py":
                continue
            rel = f"{pkg}/{p.name}"
            own = ROOT / "tests" / pkg / f"test_{p.stem}.py"
            other = COVERED_BY.get(rel)
            if own.exists():
                continue
            if other and f"timerome.{pkg}.{p.stem}" in (ROOT / "tests" / other).read_text(encoding="utf-8"):
                continue
            missing.append(rel)
    assert not missing, f"concept modules without tests/<package>/test_<module>.py: {missing}"


def test_the_tests_mirror_the_packages():
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders - {"benchmarks"} <= packages, f"test folders with no package: {sorted(folders - packages)}"
    assert set(CONCEPT_PACKAGES) <= folders
    # the tests import their shared helpers as `conftest` (pythonpath = tests): a conftest.py in a folder
    # would be imported under that same name and hide the root one from the folders collected after it
    nested = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("conftest.py") if p.parent != ROOT / "tests"]
    assert not nested, f"put fixtures in tests/conftest.py, not {nested}"
