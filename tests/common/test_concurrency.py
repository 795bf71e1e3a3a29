"""Two processes on one folder: cache writes, a cache entry, an experiment folder, a reference model, a damaged cell."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from timerome.errors import TimeromeError

ROOT = Path(__file__).resolve().parents[2]


def spawn(code: str, *args, env=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **(env or {}))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p, timeout=300):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-2000:]
    return out, err


WRITER = """
import sys
from timerome.common.cache import write_json, save_tensors
import torch
path, me = sys.argv[1], sys.argv[2]
for i in range(200):
    write_json(path + ".json", {"writer": me, "i": i, "pad": "x" * 2000})
    save_tensors(path + ".safetensors", {"w": torch.full((64,), float(i))}, metadata={"writer": me})
print("ok")
"""


def test_two_writers_on_one_cache_file_never_collide(tmp_path):
    """200 + 200 concurrent atomic writes of the same names: none fails, the file is always whole."""
    target = tmp_path / "entry"
    procs = [spawn(WRITER, target, me) for me in ("a", "b")]
    for p in procs:
        assert finish(p)[0].strip() == "ok"
    assert json.loads((tmp_path / "entry.json").read_text())["i"] == 199
    from safetensors.torch import load_file

    assert float(load_file(str(tmp_path / "entry.safetensors"))["w"][0]) == 199.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.json", "entry.safetensors"]  # no temporary left


REWRITER = """
import sys, time
import torch
from timerome.common.cache import save_tensors
path, seconds = sys.argv[1], float(sys.argv[2])
t0, i = time.time(), 0
while time.time() - t0 < seconds:  # versions of different sizes, each renamed into place
    n = 20 + i % 7
    save_tensors(path, {"U": torch.full((n, 128), float(i), dtype=torch.float64)}, metadata={"i": str(i), "n": str(n)})
    i += 1
print(i)
"""


def test_a_file_replaced_while_it_is_read_reads_as_one_version(tmp_path):
    """`read_tensors` (memories, caches, traces, training states) while another process renames new
    versions of the file into place in a loop: every read is one version, its tensors those its header
    names. safetensors' own reader maps the file again by name for the tensors, so a version renamed in
    between gave the old header over the new bytes (2-6 % of reads in two runs, or an error)."""
    from timerome.common.cache import read_tensors, save_tensors

    import torch

    path = tmp_path / "m.safetensors"
    save_tensors(path, {"U": torch.zeros(20, 128, dtype=torch.float64)}, metadata={"i": "0", "n": "20"})
    writer = spawn(REWRITER, path, 3.0)
    reads, versions = 0, set()
    while writer.poll() is None:
        tensors, meta = read_tensors(path)
        u = tensors["U"]
        assert u.shape == (int(meta["n"]), 128) and bool((u == float(meta["i"])).all()), meta
        reads, versions = reads + 1, versions | {meta["i"]}
    assert finish(writer)[0].strip() and reads > 20 and len(versions) > 5, (reads, len(versions))


EXPERIMENT = """
import json, os, sys, time
import torch
torch.set_num_threads(1)
from timerome import load_backbone
from timerome.experiments.runner import Cell, Context, Runner, measurement

@measurement("slow_test_cell")
def slow(cell, ctx, rows, task):
    time.sleep(0.05)
    return {"metrics": {"x": float(cell.seed)}, "pid": os.getpid()}

out, n = sys.argv[1], int(sys.argv[2])
gate = sys.argv[3] if len(sys.argv) > 3 else None
computed = []
def executor(cells, ctx, done, progress=True, title=""):
    for i, c in enumerate(cells):
        from timerome.experiments.runner import execute
        done(i, execute(c, ctx))
        computed.append(i)
        if gate and i == 0:  # hold the folder until the test has seen the other run told to wait
            open(gate + ".started", "w").close()
            t0 = time.time()
            while not os.path.exists(gate) and time.time() - t0 < 240:
                time.sleep(0.05)
ctx = Context(load_backbone(), progress=False)
cells = [Cell("slow_test_cell", seed=s, data=dict(splits=["forget"])) for s in range(n)]
results = Runner(out, progress=False, executor=executor).run(cells, ctx)
print(json.dumps({"computed": len(computed), "results": results}))
"""


def test_two_processes_on_one_experiment_folder(tmp_path):
    """The second run waits for the first (told who holds the folder), then reads every cell from
    the cache: each cell is computed once, every cell file is whole, both runs agree."""
    gate = tmp_path / "gate"
    procs = [spawn(EXPERIMENT, tmp_path / "exp", 30, gate)]
    t0 = time.time()
    while not Path(f"{gate}.started").exists():  # the first run holds the folder and has computed a cell
        assert procs[0].poll() is None and time.time() - t0 < 240, "the first run never started computing"
        time.sleep(0.05)
    procs.append(spawn(EXPERIMENT, tmp_path / "exp", 30))
    told = []
    for line in procs[1].stderr:  # the second run is told who holds the folder, then waits
        told.append(line)
        if "is in use by pid" in line:
            break
    gate.touch()
    outs = [finish(p) for p in procs]
    outs[1] = (outs[1][0], "".join(told) + outs[1][1])
    runs = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert sorted(r["computed"] for r in runs) == [0, 30]
    assert runs[0]["results"] == runs[1]["results"]
    assert len({r["pid"] for r in runs[0]["results"]}) == 1  # one process computed them all
    waited = [e for _, e in outs if "is in use by pid" in e]
    assert len(waited) == 1 and "waiting" in waited[0]
    cells = list((tmp_path / "exp" / "cells").iterdir())
    assert len(cells) == 30 and all(json.loads(c.read_text())["result"]["metrics"] for c in cells)


def held_elsewhere(how: str, path):
    """A process holding `path` for 30 s with `how` (a context manager of timerome, "common.lock.hold" or
    "memory.memory_file.changing"), once it says it holds it."""
    module, fn = how.rsplit(".", 1)
    holder = spawn(f"""
        import sys, time
        from timerome.{module} import {fn}
        with {fn}(sys.argv[1]):
            print("held", flush=True)
            time.sleep(30)
        """, path)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_busy_folder_is_refused_by_name_without_wait(tmp_path):
    from timerome.common.lock import LOCK_NAME, hold

    holder = held_elsewhere("common.lock.hold", tmp_path / LOCK_NAME)
    try:
        with pytest.raises(TimeromeError, match=rf"in use by pid {holder.pid} .*choose another folder"):
            with hold(tmp_path / LOCK_NAME, wait=False, what="the folder"):
                pass
        with pytest.raises(TimeromeError, match="still in use .* after 0.5 s"):
            with hold(tmp_path / LOCK_NAME, wait=0.5, what="the folder"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with hold(tmp_path / LOCK_NAME, wait=False):  # the lock died with its holder: nothing stale
        pass


REFERENCE = """
import sys, torch
torch.set_num_threads(1)
from timerome.training.from_scratch import reference_model
bb = reference_model(epochs=2, n_authors=2, batch_size=16, progress=False)
print(bb.fingerprint())
"""


def test_two_processes_need_the_same_reference_model(tmp_path):
    """One trains it, the other waits and reads it: one entry, no temporary folder left, same weights."""
    env = {"TIMEROME_CACHE": str(tmp_path)}
    procs = [spawn(REFERENCE, env=env) for _ in range(2)]
    outs = [finish(p) for p in procs]
    assert outs[0][0].strip() == outs[1][0].strip()
    entries = sorted(p.name for p in (tmp_path / "reference").iterdir())
    assert len([e for e in entries if not e.endswith(".lock")]) == 1, entries  # no .part, no train-state left
    assert sum("in use by" in e for _, e in outs) <= 1  # the later one waited, unless the first had finished


ENTRY = """
import json, os, sys, time
import torch
from timerome.common.cache import cached_tensors
log, gate = sys.argv[1], sys.argv[2]

def make():  # slow, and it says so: the test counts how many processes made the entry
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    open(gate + ".started", "w").close()
    t0 = time.time()
    while not os.path.exists(gate) and time.time() - t0 < 60:
        time.sleep(0.05)
    return {"h": torch.arange(6.0) * os.getpid()}

print(json.dumps(cached_tensors("calibration", {"what": "a shared entry"}, make)["h"].tolist()))
"""


def test_two_processes_need_the_same_cache_entry(tmp_path):
    """One makes it, the other waits for it (told who holds it) and reads what the first made: made
    once, the same numbers in both, no lock file left."""
    env = {"TIMEROME_CACHE": str(tmp_path / "cache")}
    log, gate = tmp_path / "made.log", tmp_path / "gate"
    first = spawn(ENTRY, log, gate, env=env)
    t0 = time.time()
    while not (tmp_path / "gate.started").exists():  # the first is making the entry
        assert time.time() - t0 < 120 and first.poll() is None, first.communicate()[1][-2000:]
        time.sleep(0.05)
    second = spawn(ENTRY, log, gate, env=env)
    told = ""
    for said in second.stderr:  # the second asks for the entry meanwhile, and says that it waits
        told += said
        if "in use by" in said:
            break
    gate.touch()
    (out1, _), (out2, err2) = finish(first), finish(second)
    assert "note: the cache entry calibration/" in told and "in use by" in told, told + err2
    assert len(log.read_text().split()) == 1  # made once
    assert json.loads(out1) == json.loads(out2)
    assert [p.suffix for p in (tmp_path / "cache" / "calibration").iterdir()] == [".safetensors"]


def test_a_cache_that_cannot_be_written_makes_the_entry_and_says_why_it_is_not_kept(tmp_path, monkeypatch):
    """No lock can be taken where the cache folder cannot be made: the entry is made all the same, and
    its write fails with the cache's one-line message, as before there was a lock."""
    from timerome.common.cache import cached_tensors, entry_lock

    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("TIMEROME_CACHE", str(blocked))
    with entry_lock(blocked / "calibration" / "x.safetensors", "an entry"):
        pass  # nothing held, no error
    made = []
    with pytest.raises(TimeromeError, match="could not write"):
        cached_tensors("calibration", {"k": 1}, lambda: made.append(1) or {"h": torch.zeros(2)})
    assert made == [1]


def test_a_damaged_cell_is_reported_moved_aside_and_recomputed(tmp_path, capsys):
    from timerome import load_backbone
    from timerome.experiments.runner import Cell, Context, Runner, measurement

    calls = []

    @measurement("count_test_cell")
    def count(cell, ctx, rows, task):
        calls.append(cell.seed)
        return {"metrics": {"x": float(cell.seed)}}

    ctx = Context(load_backbone(), progress=False)
    cells = [Cell("count_test_cell", seed=s, data=dict(splits=["forget"])) for s in range(3)]
    runner = Runner(tmp_path, progress=False)
    first = runner.run(cells, ctx)
    damaged = runner.path(cells[1], ctx)
    damaged.write_text(damaged.read_text()[:40])
    calls.clear()
    assert runner.run(cells, ctx) == first and calls == [1]  # only the damaged cell, the same result
    aside = [p.name for p in damaged.parent.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].startswith(damaged.name)
    assert f"cell file {damaged} was unreadable" in capsys.readouterr().err


def test_saved_tensors_are_as_readable_as_any_other_file(tmp_path):
    """safetensors creates its files 0600; a memory or model handed to a collaborator must follow the umask."""
    import os

    import torch

    from timerome.common.cache import save_tensors

    old = os.umask(0o022)
    try:
        p = save_tensors(tmp_path / "x.safetensors", {"w": torch.zeros(2)})
    finally:
        os.umask(old)
    assert p.stat().st_mode & 0o777 == 0o644


# ------------------------------------------------------------------------------ issue 23: memory files, resuming


def _fork_cli(args, log):
    """A child process (forked: the parent's imports and caches are shared, so it starts in milliseconds)
    running `timerome ARGS`; its output goes to `log`. Returns its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            from typer.testing import CliRunner

            from timerome.cli import app

            res = CliRunner().invoke(app, [str(a) for a in args])
            Path(log).write_text(res.output)
            code = res.exit_code
        finally:
            os._exit(code)
    return pid


def _wait(pid) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_two_concurrent_memory_adds_never_lose_a_fact(tmp_path):
    """20 rounds of two `timerome memory add` on one file at once: every fact of both is in the file after
    each round (the second waits for the first and adds to what it wrote), the file always loads, and no
    lock or temporary file is left beside it."""
    from typer.testing import CliRunner

    from timerome.cli import app
    from timerome.data.tofu import load_split
    from timerome.memory.memory_file import read_memory_file

    mem = tmp_path / "mem" / "m.safetensors"
    mem.parent.mkdir()
    assert CliRunner().invoke(app, ["edit", "--out", str(mem)]).exit_code == 0
    rows = load_split("retain_perturbed", "embedded")[:40]
    files = []
    for i, r in enumerate(rows):
        files.append(tmp_path / f"row{i}.jsonl")
        files[-1].write_text(json.dumps(dict(question=r["question"], answer=r["answer"], author=r["author"],
                                             fact_id=f"new-{i}")))
    for k in range(20):
        pids = [_fork_cli(["memory", "add", mem, "--data", files[2 * k + j]], tmp_path / f"log{k}-{j}") for j in (0, 1)]
        codes = [_wait(p) for p in pids]
        assert codes == [0, 0], [(tmp_path / f"log{k}-{j}").read_text() for j in (0, 1)]
        _, meta = read_memory_file(mem)
        ids = [f["fact_id"] for f in meta["facts"]]
        assert len(ids) == 20 + 2 * (k + 1) and {f"new-{i}" for i in range(2 * k + 2)} <= set(ids), (k, ids)
    assert sorted(p.name for p in mem.parent.iterdir()) == ["m.safetensors"]


def test_a_memory_file_in_use_is_refused_without_wait(tmp_path):
    from typer.testing import CliRunner

    from timerome.cli import app
    from timerome.memory.memory_file import lock_path

    mem = tmp_path / "m.safetensors"
    assert CliRunner().invoke(app, ["edit", "--out", str(mem)]).exit_code == 0
    holder = held_elsewhere("memory.memory_file.changing", mem)
    try:
        res = CliRunner().invoke(app, ["memory", "remove", str(mem), "Isgor Quielson/city", "-o",
                                       str(tmp_path / "o.safetensors"), "--no-wait"])
        assert res.exit_code == 0, res.output  # reading it is fine: another file is written
        res = CliRunner().invoke(app, ["memory", "add", str(mem), "--data", "embedded:forget05", "--no-wait"])
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and f"in use by pid {holder.pid}" in lines[0], res.output
    finally:
        holder.kill()
        holder.wait()
    assert not lock_path(mem).exists() or CliRunner().invoke(  # the lock died with its holder
        app, ["memory", "add", str(mem), "--data", "embedded:forget05", "--no-wait"]).exit_code == 0


TINY = ('{"n_mc": 2, "n_retain": 4, "n_world": 2, "rouge": false, "methods": ["no_edit", {"method": "timerome", '
        '"config": {"alpha": 4, "trace_facts": 2, "trace_steps": 2, "trace_samples": 1}}]}')
COST = ("install_seconds", "wall_seconds", "install_extra_mb", "trace_seconds")  # what differs from run to run


def _table(folder: Path) -> dict:
    """The experiment's final JSON without the compute accounting (seconds and megabytes vary run to run)."""
    d = json.loads((folder / "canonical.json").read_text())
    drop = lambda x: {k: drop(v) for k, v in x.items() if k not in COST} if isinstance(x, dict) else x  # noqa: E731
    return drop(d)


def test_an_experiment_killed_or_interrupted_resumes_to_the_same_table(tmp_path, monkeypatch):
    """SIGKILL, then SIGINT, in the middle of `timerome experiment`, then the same command again: it
    resumes from the finished cells (never recomputing one), no cell file is damaged or half-written,
    and the final table is the uninterrupted run's."""
    import signal

    from typer.testing import CliRunner

    from timerome.cli import app

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))  # the subprocesses share it: one trace
    args = ["experiment", "canonical", "--seeds", "0,1", "-c", TINY,
            "--reference", str(ROOT / "src" / "timerome" / "assets" / "default-model"), "--json", "-o"]

    def start(out):
        e = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        return subprocess.Popen([sys.executable, "-m", "timerome", *args, str(out)], env=e, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def cells(out) -> dict:
        return {c.name: c.stat().st_mtime_ns for c in (out / "cells").glob("*.json")}

    def stop_after(out, n, sig):
        p, t0 = start(out), time.monotonic()
        while len(cells(out)) < n and p.poll() is None and time.monotonic() - t0 < 240:
            time.sleep(0.02)
        if p.poll() is None:
            p.send_signal(sig)
        _, err = p.communicate(timeout=120)
        return p.returncode, err

    def interrupted_twice(stopped):
        """(cells after the SIGKILL, cells after the SIGINT), or None where a run ended before its
        signal reached it (exit 0: a machine that stalls this process for a second or two lets the
        tiny run finish first)."""
        code, err = stop_after(stopped, 1, signal.SIGKILL)
        if code == 0:
            return None
        assert code == -signal.SIGKILL, err[-1500:]
        first = cells(stopped)
        code, err = stop_after(stopped, len(first) + 1, signal.SIGINT)
        if code == 0:
            return None
        lines = [line for line in err.splitlines() if line.startswith("interrupted")]
        assert code == 130 and len(lines) == 1 and "run the same command again" in lines[0], err[-1500:]
        return first, cells(stopped)

    full = tmp_path / "full"
    res = CliRunner().invoke(app, [*args, str(full)])  # the uninterrupted run, in this process
    assert res.exit_code == 0, res.output
    for attempt in range(3):
        stopped = tmp_path / f"stopped{attempt}"
        got = interrupted_twice(stopped)
        if got is not None:
            break
    assert got is not None, "three runs in a row ended before their signal: SIGKILL / SIGINT never stopped one"
    first, second = got
    assert len(second) > len(first) and all(second[k] == t for k, t in first.items())  # went on, recomputed none
    finish(start(stopped))
    final = cells(stopped)
    assert all(final[k] == t for k, t in second.items())  # the last run computed only what was missing
    assert sorted(final) == sorted(cells(full)) and len(final) == 6
    assert [c.name for c in (stopped / "cells").iterdir() if c.name.startswith(".")] == []  # no temporary left
    assert all(json.loads(c.read_text())["result"] for c in (stopped / "cells").iterdir())  # every cell whole
    assert _table(stopped) == _table(full)
