"""The README's operating-point table: how steeply the `timerome` method's alpha acts.

Δ mean answer log-probability (edited - plain, nats, n_mc 8, the same Monte-Carlo draws) per split
at alpha 1, 1.5 (the default), 2 and 4, the memory at layer 0 resid, on the embedded default: 20
forget01 rows, 20 retain rows, 10 real-author and 10 world-fact rows; and what the greedy answers say: how many forget answers
are the target "I don't know." (and how many give the fact back), and the share of the other
splits' answers that are the unedited model's, word for word.

    python benchmarks/bench_operating_point.py [--alphas 1,1.5,2,4] [--json out.json]
    python benchmarks/bench_operating_point.py --authors forget05 [--alphas 1.5,4]

--authors SPLIT: instead, each author of SPLIT edited alone (its 20 facts), Δ LP of its own answers
and of 20 retain rows (n_mc 4): how much the operating point depends on the author; and where the
update lands (at the first alpha): the mean |update| / |h| at the coordinate over the author's
prompts, at the subject's tokens and at the answer's positions (all masked: the first denoising
step, 16 of them), the memory's update read with `EditMemory.delta`.
"""

import argparse
import json

import numpy as np
import torch

import timerome
from timerome.data.task import forget_task
from timerome.errors import script
from timerome.evaluation.evaluator import eval_rows, forget_outcomes, generate_answers, lp_only
from timerome.methods import install

SPLITS = ("forget", "retain", "real_authors", "world_facts")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alphas", default="1,1.5,2,4")
    ap.add_argument("--n-mc", type=int, default=8)
    ap.add_argument("--json", help="write the table to this JSON file")
    ap.add_argument("--authors", help="a split whose authors are edited one at a time (e.g. forget05)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.authors:
        return per_author(args)
    bb, task = timerome.load_backbone(), forget_task("embedded", "forget01")
    rows = eval_rows("embedded", n_retain=20, n_world=10)
    rows = {k: rows[k] for k in SPLITS}
    plain = {k: float(np.mean(v)) for k, v in lp_only(bb, rows, n_mc=args.n_mc).items()}

    def answers():
        return {k: generate_answers(bb, [r["question"] for r in v], [r["answer"] for r in v]) for k, v in rows.items()}

    before = answers()
    print("| alpha | " + " | ".join(f"Δ {k}" for k in SPLITS) + " | forget: refusals (leaks) | unchanged " +
          " / ".join(SPLITS[1:]) + " |")
    print("|---" * (len(SPLITS) + 3) + "|")
    table = []
    for a in (float(x) for x in args.alphas.split(",")):
        edit = install("timerome", bb, task, {"alpha": a, "coordinate": [0, "resid"]}, seed=0)
        try:
            d = {k: float(np.mean(v)) - plain[k] for k, v in lp_only(bb, rows, n_mc=args.n_mc, edit=edit).items()}
            with edit.active():
                after = answers()
        finally:
            edit.undo()
        outcomes = forget_outcomes(rows, after["forget"])
        refused, leaked = outcomes.count("Refusal"), outcomes.count("Leak")
        same = {k: float(np.mean([x == y for x, y in zip(after[k], before[k])])) for k in SPLITS[1:]}
        table.append(dict(alpha=a, refusals=refused, leaks=leaked, n_forget=len(outcomes),
                          **{f"d_{k}": v for k, v in d.items()}, **{f"unchanged_{k}": v for k, v in same.items()}))
        print(f"| {a:g} | " + " | ".join(f"{d[k]:+.2f}" for k in SPLITS) + f" | {refused} / {len(outcomes)} ({leaked}) | "
              + " / ".join(f"{same[k]:.0%}" for k in SPLITS[1:]) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(plain=plain, rows=table, n_mc=args.n_mc), f, indent=1)
    return 0


def per_author(args) -> int:
    from timerome.data import load_split
    from timerome.data.task import ForgetTask

    bb, task = timerome.load_backbone(), forget_task("embedded", args.authors)
    retain = load_split("retain_perturbed", "embedded")[:20]
    alphas = [float(x) for x in args.alphas.split(",")]
    print("| author | " + " | ".join(f"alpha {a:g}: Δ own / Δ retain" for a in alphas)
          + f" | alpha {alphas[0]:g}: update / h at subject / answer |")
    print("|---" * (len(alphas) + 2) + "|")
    table = []
    for author in dict.fromkeys(r["author"] for r in task.forget_rows):
        rows = [r for r in task.forget_rows if r["author"] == author]
        one = ForgetTask(forget_rows=rows, facts=[f for f in task.facts if f.subject == author],
                         retain_rows=task.retain_rows)
        ev = {"forget": rows, "retain": retain}
        plain = {k: float(np.mean(v)) for k, v in lp_only(bb, ev, n_mc=4).items()}
        cells, lands = [], None
        for a in alphas:
            edit = install("timerome", bb, one, {"alpha": a, "coordinate": [0, "resid"]}, seed=0)
            try:
                d = {k: float(np.mean(v)) - plain[k] for k, v in lp_only(bb, ev, n_mc=4, edit=edit).items()}
                lands = lands or where_it_lands(bb, edit.memory, one.facts)
            finally:
                edit.undo()
            cells.append(d)
            table.append(dict(author=author, alpha=a, d_own=d["forget"], d_retain=d["retain"],
                              **(lands if a == alphas[0] else {})))  # where it lands: measured at the first alpha
        print(f"| {author} | " + " | ".join(f"{d['forget']:+.2f} / {d['retain']:+.2f}" for d in cells)
              + f" | {lands['update_subject']:.2f} / {lands['update_answer']:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=table, split=args.authors), f, indent=1)
    return 0


@torch.no_grad()
def where_it_lands(bb, memory, facts, n_answer: int = 16) -> dict:
    """Mean |update| / |h| at the memory's coordinate over the facts' prompts, at the subject's tokens and
    at the answer's positions (all masked, as at the first denoising step)."""
    from timerome.engine.encoding import subject_positions
    from timerome.engine.hooks import Hooks

    site = memory.coordinate.site
    subject, answer = [], []
    for f in facts:
        ids, pos = subject_positions(bb, f.prompt, f.subject, f.fact_id)
        x = torch.tensor([list(ids) + [bb.mask_id] * n_answer], device=bb.device)
        with Hooks(bb, keep=[site], stop=True) as tr:
            bb.logits(x)
        h = tr[site][0][0].double()
        share = memory.delta(h).norm(dim=-1) / h.norm(dim=-1)
        subject.append(share[list(pos)].mean().item())
        answer.append(share[len(ids):].mean().item())
    return dict(update_subject=float(np.mean(subject)), update_answer=float(np.mean(answer)))


if __name__ == "__main__":
    raise SystemExit(script(main))
