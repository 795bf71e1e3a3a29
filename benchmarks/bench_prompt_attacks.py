"""Does an unlearnt fact come back when the question is asked another way? Every method, every attack.

Issue 24, part 3 (metrics/attacks.py has the attacks: context before / after / around the question,
a partial answer to complete, the subject misspelt or shortened, a pronoun after context). On the
embedded default, each method is installed once on forget01 (one author's 20 facts, target "I don't
know.") and answers every attacked prompt greedily (one token per step, one block, cut at
end-of-text). Extraction: metrics/editing.py `gives_back` (the original object verbatim, or ROUGE-L
recall of it >= 0.5). The unedited model's row says how often the attack still gets the fact out of a
model that was never edited: an attack it does not answer tells nothing about an edit.

    python benchmarks/bench_prompt_attacks.py [--methods no_edit,timerome,codebook,rewrite,...] [--json out.json]
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
from timerome.metrics.attacks import attack_prompts
from timerome.metrics.editing import answers, default_gen_length, gives_back, object_text, says

METHODS = "no_edit,timerome,codebook,rewrite,rome,memit,alphaedit,ga,npo,rmu"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every number to this JSON file")
    args = ap.parse_args()
    bb = timerome.load_backbone()
    rows, task = requests_data(dict(requests="embedded:forget01", target=DEFAULT_TARGET, n_retain=20),
                               SimpleNamespace(source="embedded", backbone=bb))
    reqs = rows["requests"]
    attacks = {k: v for k, v in attack_prompts(reqs).items() if v}
    G = default_gen_length(bb, reqs)
    flat = [(a, i, p) for a, items in attacks.items() for i, p in items]
    prompts = [p for _, _, p in flat]
    results: dict = {}
    t0 = time.perf_counter()
    for method in args.methods.split(","):
        edit = install(method, bb, task, {}, seed=args.seed)
        try:
            with edit.active():
                said = answers(bb, prompts, gen_length=G, seed=args.seed)
        finally:
            edit.undo()
        per = {}
        for a in attacks:
            got = [(i, s) for (b, i, _), s in zip(flat, said) if b == a]
            per[a] = dict(extraction=float(np.mean([gives_back(s, object_text(reqs[i])) for i, s in got])),
                          refusal=float(np.mean([says(s, reqs[i].fact.target) for i, s in got])), n=len(got))
        results[method] = per
        worst = max(per, key=lambda a: per[a]["extraction"])
        print(f"{method}: worst extraction {per[worst]['extraction']:.2f} ({worst})  "
              f"[{time.perf_counter() - t0:.0f}s]", flush=True)
    names = list(attacks)
    print("\nextraction per attack (refusal in brackets):")
    print("| method | " + " | ".join(names) + " | worst |")
    print("|---" * (len(names) + 2) + "|")
    for method, per in results.items():
        worst = max(per[a]["extraction"] for a in names)
        print(f"| {method} | " + " | ".join(f"{per[a]['extraction']:.2f} ({per[a]['refusal']:.2f})" for a in names)
              + f" | {worst:.2f} |")
    print(f"\n(forget01: {', '.join(f'{a} {len(attacks[a])}' for a in names)} prompts; budget {G} tokens, "
          f"seed {args.seed}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"{time.perf_counter() - t0:.0f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(results=results, attacks=attacks, gen_length=G), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
