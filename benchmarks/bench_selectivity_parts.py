"""The codebook memory away from its calibration set, its design choices and its costs
(bench_selectivity.py's `robustness`, `directions` and `costs` parts; run them through that script).

robustness: d (edited - plain, nats) on rows the radii never saw, for codebook, codebook with
object keys, timerome (defaults and the paper variant) and rome:
  relearn     metrics.robustness's in-context relearning probe: the question and its answer shown,
              then the question again (plain and edited both see it, so d is what the edit still takes away)
  paraphrase  the forget questions paraphrased (TOFU's paraphrased_question)
  heldout     retain rows of authors outside the calibration set (embedded: retain90 authors that
              retain_perturbed does not hold; TOFU: the second half of its retain authors, the
              memory then calibrated on the first half only)
  neighbours  name-sharing neighbours the model never saw: the forget subject's first word with
              another author's last word and the other way round, on the forget questions; built
              from two disjoint halves of the retain authors, half A offered to `calibration`
              (neighbour-aware radii) and half B scored
directions: the embedded model, codebook at its defaults but one setting: layer, margin, values,
per-fact coordinates, object keys, key states; and keys read at layer 0 with the value written at
a deeper layer (one hook reads the gate, another adds the delta).
generations: greedy answers (length-oracle, evaluation.generate_answers) to a few forget and retain
questions, plain and with the codebook memory at a few settings: what the log-probabilities hide.
costs: install time (prepare excluded) of codebook, timerome and rome; the hook's cost per forward
(batch 16 x 32 tokens, fastest of repeats, as a ratio to the plain forward); inserting and removing
one fact against building the whole memory again; the saved file and loading it.
"""

from __future__ import annotations

from timerome.metrics.robustness import probes

import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from bench_selectivity import PAPER_VARIANT, deltas, label, lp, measure

SETS = ("relearn", "paraphrase", "heldout", "neighbours")


def _authors(rows) -> list[str]:
    from timerome.data.facts import facts_from_rows

    facts, _ = facts_from_rows(rows)
    return list(dict.fromkeys(f.subject for f in facts))


def neighbour_rows(forget_rows, subjects, others) -> list[dict]:
    """The forget questions about names that share a word with the forget subject."""
    out = []
    for other in others:
        for subject in subjects:
            a, b = subject.split(), other.split()
            for name in (f"{a[0]} {b[-1]}", f"{b[0]} {a[-1]}"):
                for r in forget_rows:
                    if subject in r["question"]:
                        out.append({"question": r["question"].replace(subject, name),
                                    "answer": r["answer"].replace(subject, name)})
    return out


def robustness_sets(setup) -> tuple[dict, object, list]:
    """(rows per set, the task whose calibration excludes `heldout`, neighbour rows for calibration)."""
    from timerome.data.rows import spread
    from timerome.data.tofu import load_split
    from timerome.evaluation import fits
    from timerome.task import ForgetTask

    bb, task, forget = setup.backbone, setup.task, setup.rows["forget"]
    # the robustness panel's own probes (metrics/robustness.py): one definition of each attack
    pr = probes(forget)
    sets = {name: [{"question": q, "answer": a} for q, a in zip(pr[cond]["prompts"], pr[cond]["answers"])]
            for name, cond in (("relearn", "relearn"), ("paraphrase", "paraphrased_question"))}
    authors = _authors(task.retain_rows)
    if setup.name == "embedded":
        known = set(authors)
        sets["heldout"] = spread([r for r in load_split("retain90", "embedded") if r["author"] not in known], 40)
        heldout_task = task
    else:
        half = set(authors[: len(authors) // 2])
        calib = [r for r in task.retain_rows if any(a in r["question"] for a in half)]
        sets["heldout"] = [r for r in setup.rows["retain"] if r not in calib]
        heldout_task = ForgetTask(task.forget_rows, task.facts, calib)
    subjects = sorted({f.subject for f in task.facts})
    n = len(authors) // 2
    calib_nb = neighbour_rows(forget, subjects, authors[:n])
    sets["neighbours"] = spread(neighbour_rows(forget, subjects, authors[n:]), 60)
    sets = {k: [r for r in v if fits(bb, r)] for k, v in sets.items()}
    return {k: v for k, v in sets.items() if v}, heldout_task, [r for r in calib_nb if fits(bb, r)]


def robustness(setup, args) -> None:
    sets, heldout_task, calib_nb = robustness_sets(setup)
    apart = heldout_task is not setup.task  # the held-out rows need a memory calibrated without them
    extra = {k: v for k, v in sets.items() if not (apart and k == "heldout")}
    plain_gate = {"write": "tokens", "complete": False, "object_keys": False}
    runs = [("codebook", {}), ("codebook", {"alpha": 2.0}), ("codebook", {"write": "tokens"}),
            ("codebook", {"write": "tokens", "complete": False}), ("codebook", {"write": "tokens", "object_keys": False}),
            ("codebook", plain_gate), ("codebook", dict(plain_gate, calibration=calib_nb)),
            ("codebook", {"calibration": calib_nb}), ("timerome", {}), ("timerome", dict(PAPER_VARIANT)), ("rome", {})]
    print(f"\n== robustness on {setup.name}: " + ", ".join(f"{k} {len(v)} rows" for k, v in sets.items())
          + f"; {len(calib_nb)} neighbour rows offered to calibration ==")
    print(f"{'method':52s}{'d_forget':>10}" + "".join(f"{k:>12}" for k in SETS) + f"{'d_retain':>10}")
    for method, cfg in runs:
        r = measure(setup, args, method, cfg, extra_rows=extra)
        d = dict(r["d"])
        if apart and "heldout" in sets:
            d["heldout"] = measure(setup, args, method, cfg, {"heldout": sets["heldout"]}, heldout_task)["d"]["heldout"]
        name = label(dict(r, config={k: ("neighbours A" if k == "calibration" else v) for k, v in cfg.items()}))
        print(f"{name:52s}{d['forget']:10.2f}" + "".join(f"{d.get(k, float('nan')):12.3f}" for k in SETS)
              + f"{d['retain']:10.3f}", flush=True)


# ------------------------------------------------------------------------------ directions


def _split_edit(setup, write_layer: int, alpha: float):
    """Keys read at the traced layer (0 here), the fact's delta (read at `write_layer`) added there,
    at the tokens where the radius gate fires (write "tokens", no complete gate, no object keys)."""
    from timerome.capture import capture_facts
    from timerome.hooks import Hooks
    from timerome.methods.codebook import build, coordinates
    from timerome.methods.registry import InferenceEdit, method_config

    bb, task = setup.backbone, setup.task
    cfg = method_config("codebook", {"alpha": alpha, "write": "tokens", "complete": False, "object_keys": False})
    (coord, facts), = coordinates(bb, task, cfg)[0].items()
    mem = build(bb, task, cfg, coord, facts, seed=0)
    D = capture_facts(bb, facts, (write_layer, "resid")).deltas.float()
    owner = mem.owners
    box = {}

    def read(h, _st):
        box["g"], box["e"] = mem.gate(h)

    def write(h, _st):
        g, e = box["g"].float(), box["e"]
        return h + (alpha * g[:, None] * D[owner[e]]).view_as(h).to(h.dtype)

    return InferenceEdit(method="codebook", config={}, context=lambda: Hooks(bb, edit={coord: read, (write_layer, "resid"): write}))


def directions(setup, args) -> None:
    runs = [({"coordinate": [layer, "resid"]}, None) for layer in range(setup.backbone.n_layers)]
    runs += [({"margin": m}, None) for m in (0.5, 1.0, 1.5)] + [({"inner": 0.0}, None), ({"inner": 0.9}, None)]
    runs += [({"values": "states"}, None), ({"values": "states", "alpha": 16.0}, None)]
    runs += [({"coordinates": "per_fact"}, None), ({"n_states": 1}, None), ({"n_states": 8}, None)]
    runs += [({"complete": False}, None), ({"object_keys": False}, None), ({"write": "tokens"}, None)]
    tokens = {"write": "tokens", "complete": False, "object_keys": False}  # the radius gate alone
    runs += [(dict(tokens, alpha=a), None) for a in (4.0, 8.0, 16.0)] + [(dict(tokens, values="states"), None)]
    runs += [(dict(tokens, coordinate=[1, "resid"]), None), (dict(tokens, coordinates="per_fact"), None)]
    runs += [({"write_layer": w, "alpha": a}, (w, a)) for w in (1, 2) for a in (8.0, 32.0)]
    print(f"\n== directions on {setup.name} (codebook at its defaults but the setting shown) ==")
    print(f"{'setting':52s}{'d_forget':>10}{'d_retain':>10}{'d_RA':>9}{'d_WF':>9}{'entries':>9}")
    for cfg, split in runs:
        if split is None:
            r = measure(setup, args, "codebook", cfg)
            d, entries = r["d"], r["info"].get("n_entries", "")
        else:
            per = []
            for seed in args.seeds:
                edit = _split_edit(setup, *split)
                per.append(deltas(lp(setup, args, seed, edit), setup.plain[seed]))
            d, entries = {k: float(np.mean([p[k] for p in per])) for k in per[0]}, ""
        name = ", ".join(f"{k}={v}" for k, v in cfg.items())
        print(f"{name:52s}{d['forget']:10.2f}{d['retain']:10.3f}{d['real_authors']:9.3f}{d['world_facts']:9.3f}"
              f"{entries:>9}", flush=True)


# ------------------------------------------------------------------------------ costs


def _fastest(fn, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def costs(setup, args) -> None:
    import torch

    from timerome.codebook_memory import CodebookMemory
    from timerome.methods import install

    bb, task = setup.backbone, setup.task
    edits = {m: install(m, bb, task, seed=0) for m in ("codebook", "timerome", "rome")}
    edits["rome"].undo()
    print(f"\n== costs on {setup.name} (one run; fastest of repeats; shared machine) ==")
    print("install s (prepare excluded): " + ", ".join(f"{m} {e.install_seconds:.3f}" for m, e in edits.items()))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, bb.vocab_size, (16, 32), generator=g)
    subject = bb.encode(task.facts[0].subject)
    ids[:, 2:2 + len(subject)] = torch.tensor(subject)  # the subject stands in every row: the gate fires
    best = {"plain": float("inf"), "codebook": float("inf"), "timerome": float("inf")}
    with torch.no_grad():
        for _ in range(15):  # interleaved rounds: load from other jobs hits all three alike
            for m in best:
                with edits[m].active() if m != "plain" else nullcontext():
                    best[m] = min(best[m], _fastest(lambda: bb.logits(ids), 1))
    for m in ("codebook", "timerome"):
        print(f"forward with {m}'s hook / plain forward: {best[m] / best['plain']:.3f} "
              f"({best[m] * 1e3:.2f} ms vs {best['plain'] * 1e3:.2f} ms)")
    mem = edits["codebook"].memory
    cal = mem._calib  # the same calibration tokens
    one, rest = task.facts[-1], task.facts[:-1]
    build = _fastest(lambda: _copy(mem, bb, cal).add(task.facts), 3)
    base = _copy(mem, bb, cal).add(rest)
    insert = _fastest(lambda: base.add([one]).remove(one.fact_id), 3)
    full = _copy(mem, bb, cal).add(task.facts)
    remove = _fastest(lambda: _copy_of(full).remove(one.fact_id), 3)
    print(f"memory of {len(task.facts)} facts: build {build:.3f} s; insert one fact + remove it {insert:.3f} s "
          f"({build / insert:.1f}x faster than a rebuild); remove one {remove * 1e3:.2f} ms")
    with tempfile.TemporaryDirectory() as d:
        path = mem.save(Path(d) / "m.safetensors")
        t = _fastest(lambda: CodebookMemory.load(path, bb), 3)
        print(f"saved file {path.stat().st_size / 1e6:.2f} MB ({mem.n_entries} entries); load {t:.3f} s")


def _copy(mem, bb, calibration):
    from timerome.codebook_memory import CodebookMemory

    return CodebookMemory(bb, mem.coordinate, background=mem.stats, calibration=calibration, alpha=mem.alpha,
                          margin=mem.margin, inner=mem.inner, complete=mem.complete, n_states=mem.n_states,
                          values=mem.values, object_keys=mem.object_keys, target=mem.target, seed=mem.seed)


def _copy_of(mem):
    import copy

    return copy.copy(mem)


# ------------------------------------------------------------------------------ generations


def generations(setup, args) -> None:
    from timerome.evaluation import generate_answers
    from timerome.methods import install

    bb = setup.backbone
    rows = setup.rows["forget"][:3] + setup.rows["retain"][:2]
    q, a = [r["question"] for r in rows], [r["answer"] for r in rows]
    print(f"\n== generations on {setup.name} (greedy, as many tokens as the reference answer) ==")
    answers = {"plain": generate_answers(bb, q, a, seed=0)}
    for cfg in ({}, {"alpha": 1.0}, {"alpha": 2.0}, {"write": "tokens"}):
        with install("codebook", bb, setup.task, cfg, seed=0).active():
            answers[label({"method": "codebook", "config": cfg})] = generate_answers(bb, q, a, seed=0)
    for i, question in enumerate(q):
        print(f"{'forget' if i < 3 else 'retain'}: {question}")
        for name, got in answers.items():
            print(f"    {name:28s} {got[i][:110]}")
