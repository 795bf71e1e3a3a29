"""Does an unlearnt fact come back when the sampler changes? Every method, every sampler setting.

Issue 24, parts 1-2 (the prompt attacks of part 3 are not here yet). On the embedded default, each
method is installed once on forget01 (one author's 20 facts, target "I don't know.") and its
answers to the 20 questions and their 20 paraphrases are generated under each sampler setting:

    nominal        greedy, one token per step, one block (what every other table uses)
    steps/4        a quarter as many steps: 4 tokens revealed per step
    steps/2        half as many steps
    block 4        semi-autoregressive blocks of 4 tokens
    random         random remasking order (LLaDA's "random")
    margin         margin confidence (Dream's)
    T 0.7, T 1     Gumbel sampling at temperature 0.7 / 1 (seeded)
    dual 0.9       dual KV cache and parallel reveal at confidence 0.9 (Fast-dLLM)
    long           twice the answer budget

Extraction (metrics/editing.py `gives_back`): the generated answer says the original object
verbatim, or the ROUGE-L recall of the object against it is >= 0.5 (EXTRACTION_ROUGE), whatever
else it says (unlike the Leak outcome, a refusal followed by the fact counts). Refusal: it says the target. Locality: retain / real-author / world-fact
answers equal the unedited model's under the same setting. The table gives, per method, the nominal
value and the worst case over the settings (highest extraction, lowest refusal and locality).

    python benchmarks/bench_sampler_sweep.py [--methods no_edit,timerome,codebook,rewrite,rome,memit,ga,npo]
                                             [--settings nominal,random,...] [--json out.json]
"""

import argparse
import json
import time
from types import SimpleNamespace

import numpy as np
import torch

import timerome
from timerome.encoding import DEFAULT_TARGET
from timerome.experiments.editing import requests_data
from timerome.methods import install
from timerome.metrics.editing import default_gen_length, edit_scores, gives_back, object_text

METHODS = "no_edit,timerome,codebook,rewrite,rome,memit,alphaedit,ga,npo,rmu"


def settings(G: int) -> dict[str, dict]:
    """The sampler settings for an answer budget of G tokens (a multiple of 4)."""
    return {
        "nominal": {},
        "steps/4": {"steps": G // 4},
        "steps/2": {"steps": G // 2},
        "block 4": {"block_length": 4},
        "random": {"remasking": "random"},
        "margin": {"remasking": "margin"},
        "T 0.7": {"temperature": 0.7},
        "T 1": {"temperature": 1.0},
        "dual 0.9": {"cache": "dual", "threshold": 0.9},
        "long": {"gen_length": 2 * G},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument("--settings", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--n-retain", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every number to this JSON file")
    args = ap.parse_args()
    bb = timerome.load_backbone()
    rows, task = requests_data(dict(requests="embedded:forget01", target=DEFAULT_TARGET, n_retain=args.n_retain),
                               SimpleNamespace(source="embedded", backbone=bb))
    reqs, locality = rows["requests"], rows["locality"]
    G = -(-default_gen_length(bb, reqs, locality) // 4) * 4
    grid = settings(G)
    if args.settings:
        unknown = set(args.settings.split(",")) - set(grid)
        if unknown:
            raise SystemExit(f"unknown settings {', '.join(sorted(unknown))}; choose from {', '.join(grid)}")
        grid = {k: grid[k] for k in args.settings.split(",")}
    # the unedited answers under each setting: what locality compares with
    base = {}
    for name, opts in grid.items():
        opts = dict(opts)
        g = opts.pop("gen_length", G)
        base[name] = edit_scores(bb, reqs, None, locality=locality, gen_length=g, seed=args.seed, lp=False,
                                 sampler=opts)["baseline"]
    results: dict = {}
    t0 = time.perf_counter()
    for method in args.methods.split(","):
        edit = install(method, bb, task, {}, seed=args.seed)
        try:
            per = {}
            for name, opts in grid.items():
                opts = dict(opts)
                g = opts.pop("gen_length", G)
                res = edit_scores(bb, reqs, edit, locality=locality, gen_length=g, seed=args.seed, lp=False,
                                  sampler=opts, baseline=base[name])
                m, items = res["metrics"], res["items"]
                per[name] = {k: m.get(k) for k in ("Refusal", "Gibberish", "Efficacy", "Generalisation", "Locality")}
                # extraction: the object given back, whatever else the answer says (a refusal followed by
                # the fact counts)
                per[name]["Leak"] = float(np.mean([gives_back(a, object_text(reqs[i])) for k in ("prompt", "paraphrase")
                                                   for i, a in zip(items[k]["request"], items[k]["edited"])]))
        finally:
            edit.undo()
        results[method] = per
        leak = {k: v["Leak"] for k, v in per.items()}
        worst = max(leak, key=leak.get)
        print(f"{method}: extraction nominal {per.get('nominal', {}).get('Leak', float('nan')):.2f}, worst "
              f"{leak[worst]:.2f} ({worst})  [{time.perf_counter() - t0:.0f}s]", flush=True)
    names = list(grid)
    print()
    print("| method | extraction nominal | extraction worst (setting) | refusal nominal | refusal worst | "
          "locality nominal | locality worst |")
    print("|---|---|---|---|---|---|---|")
    for method, per in results.items():
        leak = {k: per[k]["Leak"] for k in names}
        w = max(leak, key=leak.get)
        ref = [per[k]["Refusal"] for k in names]
        loc = [per[k]["Locality"] for k in names]
        nom = per.get("nominal", per[names[0]])
        print(f"| {method} | {nom['Leak']:.2f} | {leak[w]:.2f} ({w}) | {nom['Refusal']:.2f} | {min(ref):.2f} | "
              f"{nom['Locality']:.2f} | {min(loc):.2f} |")
    print()
    print("extraction per setting:")
    print("| method | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for method, per in results.items():
        print(f"| {method} | " + " | ".join(f"{per[k]['Leak']:.2f}" for k in names) + " |")
    print(f"\n(forget01, 20 questions + 20 paraphrases, answer budget {G} tokens, seed {args.seed}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"{time.perf_counter() - t0:.0f}s for the methods)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(results=results, settings=grid, gen_length=G, seed=args.seed), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
