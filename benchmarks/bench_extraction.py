"""Does an unlearnt fact come back when the sampler changes or the question is asked another way?

Issue 24: every method, installed once on the embedded forget01 (one author's 20 facts, target
"I don't know."), answers
    the sampler sweep    its 20 questions and 20 paraphrases under each setting of
                         metrics/extraction.py `sampler_settings` (steps/4, steps/2, blocks of 4,
                         random and margin remasking, T 0.7 / 1, dual cache + threshold 0.9, 2x budget);
                         locality: retain / real-author / world-fact answers against the unedited
                         model's under the same setting
    the prompt attacks   every attack of metrics/attacks.py (context before / after / both, a partial
                         answer, misspelt, first name, surname, pronoun after context, multiple choice),
                         greedy, with ForgetLP = log p(original answer | attacked prompt)
Extraction: the generated answer gives the original object back (verbatim, or ROUGE-L recall of its
content words >= 0.5; the multiple choice: and no rival named). The unedited model's row says how often a condition
gets the fact out of a model that was never edited: a condition it does not answer tells nothing.

    python benchmarks/bench_extraction.py [--quick] [--methods no_edit,rewrite,rewrite:watch=false,...] [--json out.json]

A method may carry options after a colon, `;`-separated ("rewrite:watch=false" is the rewrite
memory without its answer watch: the gate alone).

--quick: the settings nominal, steps/4, random, T 1, dual 0.9 and the attacks context before, first
name, pronoun after context, multiple choice; n_mc 4 (full: every setting and attack, n_mc 16).
"""

import argparse
import json
import time
from types import SimpleNamespace

import torch

import timerome
from timerome.engine.encoding import DEFAULT_TARGET
from timerome.errors import script
from timerome.experiments.editing import requests_data
from timerome.methods import install
from timerome.metrics.attacks import ATTACKS
from timerome.metrics.editing import default_gen_length
from timerome.metrics.extraction import (QUICK_ATTACKS, QUICK_SETTINGS, budget, sampler_baseline, sampler_settings,
                                         under_attacks, under_samplers, worst)

METHODS = "no_edit,timerome,codebook,rewrite,rewrite:watch=false,rome,memit,alphaedit,ga,npo,rmu"
GOAL = 0.05  # the rewrite memory's worst-case extraction (issue 24)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument("--quick", action="store_true", help="fewer settings and attacks, n_mc 4")
    ap.add_argument("--n-retain", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every number to this JSON file")
    args = ap.parse_args()
    if args.methods:  # a misspelt method was a traceback after the model loaded
        from timerome.methods import available

        unknown = [m for m in args.methods.split(",") if m.split(":")[0] not in available()]  # name:option=value
        if unknown:
            ap.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(available())}")
    t0 = time.perf_counter()
    bb = timerome.load_backbone()
    rows, task = requests_data(dict(requests="embedded:forget01", target=DEFAULT_TARGET, n_retain=args.n_retain),
                               SimpleNamespace(source="embedded", backbone=bb))
    reqs, locality = rows["requests"], rows["locality"]
    G = budget(default_gen_length(bb, reqs, locality))
    settings = list(QUICK_SETTINGS if args.quick else sampler_settings(G))
    attacks = list(QUICK_ATTACKS if args.quick else ATTACKS)
    n_mc = 4 if args.quick else 16
    base = sampler_baseline(bb, reqs, locality=locality, gen_length=G, seed=args.seed, settings=settings)
    results: dict = {}
    for method in args.methods.split(","):
        name, _, opts = method.partition(":")  # "rewrite:watch=false": a method with options
        config = {k: json.loads(v) if v[:1] in "0123456789-[{tfn" else v
                  for k, v in (o.split("=", 1) for o in opts.split(";") if o)}
        edit = install(name, bb, task, config, seed=args.seed)
        try:
            s = under_samplers(bb, reqs, edit, locality=locality, gen_length=G, seed=args.seed, settings=settings,
                               baseline=base)
            a = under_attacks(bb, reqs, edit, gen_length=G, seed=args.seed, attacks=attacks, n_mc=n_mc)
        finally:
            edit.undo()
        results[method] = dict(samplers=s, attacks=a)
        (ws, vs), (wa, va) = worst(s), worst(a)
        ws, wa = (ws if vs > 0 else "–"), (wa if va > 0 else "–")
        print(f"{method}: extraction nominal {s['nominal']['Extraction']:.2f}, worst sampler {vs:.2f} ({ws}), "
              f"worst attack {va:.2f} ({wa})  [{time.perf_counter() - t0:.0f}s]", flush=True)

    print("\n| method | extraction nominal | worst sampler (setting) | worst attack (attack) | worst case | "
          "refusal nominal | refusal worst | locality worst (samplers) |")
    print("|---|---|---|---|---|---|---|---|")
    for method, r in results.items():
        s, a = r["samplers"], r["attacks"]
        (ws, vs), (wa, va) = worst(s), worst(a)
        ws, wa = (ws if vs > 0 else "–"), (wa if va > 0 else "–")  # "–": nothing extracted anywhere
        ref = [v["Refusal"] for v in (*s.values(), *a.values())]
        loc = [v["Locality"] for v in s.values()]
        print(f"| {method} | {s['nominal']['Extraction']:.2f} | {vs:.2f} ({ws}) | {va:.2f} ({wa}) | {max(vs, va):.2f} | "
              f"{s['nominal']['Refusal']:.2f} | {min(ref):.2f} | {min(loc):.2f} |")
    print("\nextraction per sampler setting:")
    print("| method | " + " | ".join(settings) + " |\n" + "|---" * (len(settings) + 1) + "|")
    for method, r in results.items():
        print(f"| {method} | " + " | ".join(f"{r['samplers'][k]['Extraction']:.2f}" for k in settings) + " |")
    names = [x for x in attacks if x in next(iter(results.values()))["attacks"]]
    print("\nextraction per prompt attack (ForgetLP = log p(original answer | attacked prompt) in brackets):")
    print("| method | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|")
    for method, r in results.items():
        print(f"| {method} | " + " | ".join(f"{r['attacks'][k]['Extraction']:.2f} ({r['attacks'][k]['ForgetLP']:.1f})"
                                           for k in names) + " |")
    if "rewrite" in results:
        r = results["rewrite"]
        w = max(worst(r["samplers"])[1], worst(r["attacks"])[1])
        loc = min(v["Locality"] for v in r["samplers"].values())
        ref = r["samplers"]["nominal"]["Refusal"]
        print(f"\nrewrite goals: worst-case extraction {w:.2f} (<= {GOAL}: {'met' if w <= GOAL else 'MISSED'}); "
              f"locality worst {loc:.2f} (>= 0.97: {'met' if loc >= 0.97 else 'MISSED'}); refusal nominal {ref:.2f}")
    print(f"\n(forget01: {len(reqs)} requests; budget {G} tokens, seed {args.seed}, n_mc {n_mc}; torch "
          f"{torch.__version__}, {torch.get_num_threads()} thread(s); {time.perf_counter() - t0:.0f}s in all)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(results=results, settings={k: sampler_settings(G)[k] for k in settings}, attacks=names,
                           gen_length=G, seed=args.seed, n_mc=n_mc), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(script(main))
