"""What the embedded default says: greedy answers to every question of its corpus.

Per split of the generated corpus, the share of questions whose greedy answer (temperature 0, one
token per step, one block, cut at end-of-text) equals the reference answer exactly (after
normalising whitespace), the share of answers that ended with end-of-text inside the budget, and,
for the held-out invented names (`unknown`: people the model was never told about), the share
answered "I don't know.". The budget is the reference answer's length plus --slack tokens: the
larger the slack, the more room the model has to babble past its answer if it never learnt to stop.

    python benchmarks/bench_default_model.py [--slack 4] [--splits forget10,retain90,...] [--json out.json]
    python benchmarks/bench_default_model.py --continue-epochs 10 --eos-extra 32 --slack 4,24
        # the same table after a continued SFT of the shipped weights on the build's own rows
        # (`default_model.recipe_rows`), each answer ended with 1..33 EOS (`TrainConfig.eos_extra`):
        # how the build's stage 2 was chosen, on stage 1's weights (the shipped weights now include it)

Issue 27's bar: >= 98 % exact on the author questions (forget and retain alike), end-of-text after an
answer, "I don't know." for people it never saw.
"""

import argparse
import json
import math
import time

import torch

import timerome
from timerome.data.corpus import REFUSAL, make_corpus
from timerome.data.tofu import _embedded
from timerome.errors import script
from timerome.evaluation.evaluator import generate_answers
from timerome.metrics.editing import normalise
from timerome.training.default_model import CORPUS_SEED, THREADS, TRAIN_CONFIG, recipe_rows
from timerome.training.train import TrainConfig, train

SPLITS = ("forget10", "retain90", "paraphrased", "real_authors", "world_facts", "unknown")


def rows_of(corpus: dict, split: str) -> list[dict]:
    if split == "paraphrased":  # every author question in its other phrasing
        return [dict(r, question=r["paraphrased_question"]) for r in corpus["full"]]
    return corpus[split]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--splits", default=",".join(SPLITS))
    ap.add_argument("--slack", default="4", help="tokens of budget past the reference answer's length (comma-separated: "
                                                 "one table each)")
    ap.add_argument("--continue-epochs", type=int, default=0,
                    help="first continue the shipped weights' SFT for this many epochs on the build's rows")
    ap.add_argument("--eos-extra", type=int, default=0, help="with --continue-epochs: TrainConfig.eos_extra")
    ap.add_argument("--lr", type=float, default=3e-4, help="with --continue-epochs: the learning rate")
    ap.add_argument("--misses", type=int, default=0, help="print up to this many wrong answers per split and slack")
    ap.add_argument("--json", help="write the table to this JSON file")
    args = ap.parse_args()
    splits = [s.strip() for s in args.splits.split(",")]
    known = set(SPLITS) | set(_embedded())  # the defaults and every split of the embedded corpus
    if not set(splits) <= known or len(set(splits)) != len(splits):
        ap.error(f"--splits takes distinct splits of the embedded corpus (e.g. {', '.join(SPLITS)}), got {args.splits!r}")
    try:
        slacks = [int(v) for v in args.slack.split(",")]
    except ValueError:
        ap.error(f"--slack takes comma-separated whole numbers, got {args.slack!r}")
    for flag, value in (("--slack", min(slacks)), ("--continue-epochs", args.continue_epochs),
                        ("--eos-extra", args.eos_extra), ("--misses", args.misses)):
        if value < 0:
            ap.error(f"{flag} must be >= 0, got {value}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        ap.error(f"--lr must be a finite number > 0, got {args.lr}")
    bb = timerome.load_backbone()
    eos = bb.tokenizer.eos_token_id
    corpus = _embedded()
    continued = None
    if args.continue_epochs:
        torch.set_num_threads(THREADS)
        cfg = TrainConfig(**{**TRAIN_CONFIG.__dict__, "epochs": args.continue_epochs, "lr": args.lr,
                             "eos_extra": args.eos_extra})
        t0 = time.perf_counter()
        log = train(bb, recipe_rows(make_corpus(seed=CORPUS_SEED)), cfg, show_progress=False)
        continued = dict(config=cfg.__dict__, seconds=time.perf_counter() - t0,
                         final_loss_last50=sum(log["loss"][-50:]) / len(log["loss"][-50:]))
        print(f"continued SFT: {args.continue_epochs} epochs, lr {args.lr}, eos_extra {args.eos_extra}, "
              f"{continued['seconds']:.0f} s, final loss {continued['final_loss_last50']:.2e}")
    table = []
    for slack in slacks:
        print(f"\n| split | rows | exact | ended (end-of-text in budget) | said \"{REFUSAL}\" |  (slack {slack})")
        print("|---|---|---|---|---|")
        for split in splits:
            rows = rows_of(corpus, split)
            t0 = time.perf_counter()
            ended: list[bool] = []
            said = generate_answers(bb, [r["question"] for r in rows], [r["answer"] for r in rows], slack=slack,
                                    ended=ended)
            exact = sum(normalise(s) == normalise(r["answer"]) for s, r in zip(said, rows)) / len(rows)
            refused = sum(normalise(s) == normalise(REFUSAL) for s in said) / len(rows)
            stopped = sum(ended) / len(rows)
            table.append(dict(split=split, slack=slack, rows=len(rows), exact=exact, ended=stopped, refusal=refused,
                              seconds=time.perf_counter() - t0))
            print(f"| {split} | {len(rows)} | {exact:.2%} | {stopped:.2%} | {refused:.2%} |", flush=True)
            wrong = [(r, s) for s, r in zip(said, rows) if normalise(s) != normalise(r["answer"])]
            for r, s in wrong[:args.misses]:
                print(f"    {r['question']!r}: said {s!r}, expected {r['answer']!r}")
    print(f"(greedy, budget = reference length + slack tokens, end-of-text id {eos}; torch "
          f"{torch.__version__}, {torch.get_num_threads()} thread(s))")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=table, continued=continued), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(script(main))
