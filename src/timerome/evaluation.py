"""TOFU-style evaluation of an (edited) MDLM: per-item log-likelihoods and the paper's columns.

    rows = eval_rows("embedded")                     # forget / retain / real_authors / world_facts
    ref = reference_truth_ratios(reference_model(), rows["forget"], n_mc=16, seed=0)
    result = evaluate(backbone, rows, n_mc=16, seed=0, reference_tr=ref, edit=edit)
    result["metrics"]["ForgetLP"], result["items"]["forget"]["lp"]

Columns (metrics.py has the formulas):
    ForgetLP / RetainLP / RealAuth / WorldFact   mean log p(answer | question), nats (MC, n_mc rows)
    ForgetTR / RetainTR                          truth ratio aggregates (closer-to-1 / true-better)
    ForgetQuality                                KS p-value vs a model never trained on the forget set
    ForgetROUGE / RetainROUGE / ...              ROUGE-L recall of greedy generations
    ModelUtility                                 harmonic mean of {prob, ROUGE, TR} on retain, RA, WF
Every item's Monte-Carlo draws come from (seed, item index) only, so two models evaluated with
the same seed share their masks: differences between them are paired, not MC noise.

Generation for ROUGE is length-oracle: each answer gets exactly as many mask tokens as its
reference has tokens, one token revealed per step (our small models never learned an end token).
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from timerome import metrics as M
from timerome.errors import TimeromeError
from timerome.progress import progress_bar

SPLIT_COLUMNS = {"forget": "ForgetLP", "retain": "RetainLP", "real_authors": "RealAuth", "world_facts": "WorldFact"}
UTILITY_SPLITS = ("retain", "real_authors", "world_facts")


# ------------------------------------------------------------------------------ data


def eval_rows(source="embedded", forget: str = "forget01", *, n_retain: int = 40, n_world: int = 20,
              retain_rows=None) -> dict[str, list[dict]]:
    """Rows by split, with their paraphrased / perturbed answers.

    forget: every row of `forget`_perturbed. retain / real_authors / world_facts: n_retain /
    n_world rows spread evenly over the perturbed splits (deterministic: the same rows for every
    method and seed). retain_rows overrides the retain pool (e.g. a TOFU subset).
    """
    from timerome.data.tofu import load_split

    rows = {"forget": load_split(f"{forget}_perturbed", source)}
    pool = retain_rows if retain_rows is not None else load_split("retain_perturbed", source)
    rows["retain"] = spread(pool, n_retain)
    rows["real_authors"] = spread(load_split("real_authors_perturbed", source), n_world)
    rows["world_facts"] = spread(load_split("world_facts_perturbed", source), n_world)
    return rows


def spread(rows: list, n: int | None) -> list:
    """n rows evenly spaced over the list (all of them when n is None or larger)."""
    if n is None or n >= len(rows):
        return list(rows)
    idx = np.linspace(0, len(rows) - 1, n).round().astype(int)
    return [rows[i] for i in idx]


def forget_task(source="embedded", forget: str = "forget01", *, retain_rows=None, background=None):
    """The ForgetTask a method receives: forget rows, their facts, retain rows."""
    from timerome.data.facts import facts_from_rows
    from timerome.data.tofu import FULL_OFFSET, load_split
    from timerome.methods import ForgetTask

    rows = load_split(forget, source)
    facts, skipped = facts_from_rows(rows, offset=FULL_OFFSET.get(forget, 0))
    if skipped:  # never silently: the user sees which rows could not become facts, and why
        import warnings

        warnings.warn(f"{len(skipped)} of {len(rows)} {forget} rows give no fact and are not edited: "
                      + "; ".join(f"row {i}: {why}" for i, why in skipped[:5]), stacklevel=2)
    if retain_rows is None:
        retain_rows = load_split("retain_perturbed", source)
    return ForgetTask(forget_rows=rows, facts=facts, retain_rows=list(retain_rows), background=background)


# ------------------------------------------------------------------------------ scoring


def _answers(row: dict) -> tuple[str, list[str]]:
    """(correct side, perturbed answers) of the truth ratio.

    TOFU: the paraphrased answer against perturbed answers written in the paraphrase's style
    (RA / WF have no paraphrase: the answer itself). When the perturbed answers are instead the
    *answer's own* template with another value (the embedded corpus: row["object"] swapped), the
    paraphrase would be compared with a template the model was trained on and every truth ratio
    would measure wording, not the fact; the answer is then the correct side, so both sides differ
    only in the value, as TOFU intends.
    """
    pert = list(row.get("perturbed_answer") or [])
    if pert and _same_template(row["answer"], row.get("object"), pert):
        return row["answer"], pert
    return row.get("paraphrased_answer") or row["answer"], pert


def _same_template(answer: str, obj, perturbed: list[str]) -> bool:
    if not obj or obj not in answer:
        return False
    head, _, tail = answer.partition(obj)
    return all(p.startswith(head) and p.endswith(tail) and p != answer for p in perturbed)


def fits(backbone, row: dict) -> bool:
    """Whether the question with every answer variant fits the model's context."""
    q = len(backbone.encode(row["question"]))
    para, pert = _answers(row)
    longest = max(len(backbone.encode(a)) for a in [row["answer"], para] + pert)
    return q + longest + 1 <= backbone.max_length


def score_split(backbone, rows: list[dict], *, n_mc: int = 16, seed: int = 0, truth_ratio: bool = True,
                rouge: bool = True, progress: bool = False) -> dict:
    """Per-item numbers of one split: lp, len, prob (and tr, para/pert terms, rouge)."""
    q = [r["question"] for r in rows]
    lp, ln = M.answer_logprobs(backbone, q, [r["answer"] for r in rows], n_mc=n_mc, seed=seed)
    out = {"lp": lp.tolist(), "len": ln.tolist(), "prob": np.exp(lp / ln).tolist()}
    has_pert = all(_answers(r)[1] for r in rows)
    if truth_ratio and has_pert and rows:
        # every variant in one batch; pair indices continue after the answers' so draws stay distinct
        para = [_answers(r)[0] for r in rows]
        pert = [_answers(r)[1] for r in rows]
        flat_q = q + [qi for qi, ps in zip(q, pert) for _ in ps]
        flat_a = para + [a for ps in pert for a in ps]
        vlp, vln = M.answer_logprobs(backbone, flat_q, flat_a, n_mc=n_mc, seed=seed + 7919)
        n = len(rows)
        pert_lp, pert_ln, at = [], [], n
        for ps in pert:
            pert_lp.append(vlp[at:at + len(ps)])
            pert_ln.append(vln[at:at + len(ps)])
            at += len(ps)
        tr = M.truth_ratio(vlp[:n], vln[:n], pert_lp, pert_ln)
        # RA / WF probability: the true answer against its perturbed ones, per-token probabilities
        norm = M.normalised_prob(lp, ln, pert_lp, pert_ln)
        out.update(tr=tr.tolist(), norm_prob=norm.tolist())
    if rouge and rows:
        preds = generate_answers(backbone, q, [r["answer"] for r in rows], seed=seed, progress=progress)
        out["generations"] = preds
        out["rouge"] = M.rouge_l_recall(preds, [r["answer"] for r in rows]).tolist()
    return out


@torch.no_grad()
def generate_answers(backbone, questions: list[str], answers: list[str], *, seed: int = 0,
                     progress: bool = False) -> list[str]:
    """Greedy (temperature 0) answers, as many tokens as each reference answer, batched by shape."""
    from timerome.sampler import generate
    from timerome.train import encode_pairs

    pairs = encode_pairs(backbone, [{"question": q, "answer": a} for q, a in zip(questions, answers)])
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (p, a) in enumerate(pairs):
        groups.setdefault((len(p), len(a)), []).append(i)
    out = [""] * len(pairs)
    with progress_bar("generating", total=len(groups), enabled=progress) as bar:
        for (_, G), idx in groups.items():
            prompt = torch.tensor([pairs[i][0] for i in idx], device=backbone.device)
            gen = torch.Generator(device=backbone.device).manual_seed(seed)
            x = generate(backbone, prompt, steps=G, gen_length=G, block_length=G, generator=gen)
            for b, i in enumerate(idx):
                out[i] = backbone.decode(x[b, prompt.shape[1]:])
            bar.advance()
    return out


def summarise(items: dict[str, dict], reference_tr=None) -> dict:
    """The paper's columns from per-item numbers (NaN where a split or reference is missing)."""
    nan = float("nan")
    m = {}
    for split, col in SPLIT_COLUMNS.items():
        m[col] = float(np.mean(items[split]["lp"])) if split in items else nan
    f, r = items.get("forget", {}), items.get("retain", {})
    m["ForgetTR"] = M.forget_truth_ratio(f["tr"]) if "tr" in f else nan
    m["RetainTR"] = M.retain_truth_ratio(r["tr"]) if "tr" in r else nan
    m["ForgetQuality"] = (M.forget_quality(f["tr"], reference_tr)
                          if "tr" in f and reference_tr is not None and len(reference_tr) else nan)
    for split, tag in (("forget", "Forget"), ("retain", "Retain"), ("real_authors", "RA"), ("world_facts", "WF")):
        if "rouge" in items.get(split, {}):
            m[f"{tag}ROUGE"] = float(np.mean(items[split]["rouge"]))
    m["ModelUtility"] = model_utility(items)
    return m


def model_utility(items: dict[str, dict]) -> float:
    """TOFU model utility: harmonic mean of prob, ROUGE-L recall and truth ratio on retain, RA, WF.

    Retain's prob is the per-token probability of the answer; RA / WF use the normalised one
    (true against perturbed). Terms missing from `items` (ROUGE switched off) are left out.
    """
    vals = []
    for split in UTILITY_SPLITS:
        it = items.get(split)
        if not it:
            continue
        prob = it["prob"] if split == "retain" or "norm_prob" not in it else it["norm_prob"]
        vals.append(float(np.mean(prob)))
        if "rouge" in it:
            vals.append(float(np.mean(it["rouge"])))
        if "tr" in it:
            vals.append(M.retain_truth_ratio(it["tr"]))
    return M.harmonic_mean(vals) if vals else float("nan")


def evaluate(backbone, rows: dict[str, list[dict]], *, n_mc: int = 16, seed: int = 0, reference_tr=None,
             edit=None, truth_ratio: bool = True, rouge: bool = True, progress: bool = False) -> dict:
    """Score every split of `rows` on backbone (with `edit` active when given).

    Returns {"items": {split: per-item lists}, "metrics": {column: value}, "cost": {...}}, all JSON-able.
    """
    from timerome.methods.registry import measure

    if not rows:
        raise TimeromeError("nothing to evaluate: rows has no splits")
    items = {}
    ctx = edit.active() if edit is not None else nullcontext()
    with measure(backbone) as cost, ctx, progress_bar("evaluating", total=len(rows), enabled=progress) as bar:
        for split, rs in rows.items():
            items[split] = score_split(backbone, rs, n_mc=n_mc, seed=seed, truth_ratio=truth_ratio,
                                       rouge=rouge)
            bar.advance(description=f"evaluated {split}")
    metrics = summarise(items, reference_tr)
    c = {"eval_seconds": cost["seconds"], "eval_peak_memory_mb": cost["peak_mb"]}
    if edit is not None:
        c.update(edit.cost())
        c.update({k: v for k, v in edit.info.items() if k.endswith("seconds")})
    return {"items": items, "metrics": metrics, "cost": c}


def lp_only(backbone, rows: dict[str, list[dict]], *, n_mc: int = 16, seed: int = 0, edit=None) -> dict[str, list[float]]:
    """Just log p(answer | question) per item and split (the cheap path of the sweeps)."""
    ctx = edit.active() if edit is not None else nullcontext()
    with ctx:
        return {s: M.answer_logprobs(backbone, [r["question"] for r in rs], [r["answer"] for r in rs],
                                     n_mc=n_mc, seed=seed)[0].tolist() for s, rs in rows.items()}


@torch.no_grad()
def trajectory_logprobs(backbone, rows: list[dict], *, steps: int = 8, edit=None) -> list[float]:
    """log p(answer | question) read along the greedy denoising trajectory (tracing's "decided"
    readout: each token scored by the forward that committed it), per row.

    Unlike the MC estimator this has denoising steps, so an edit restricted to one step k* acts
    exactly where the sampler would meet it (the all-steps vs one-step ablation).
    """
    from timerome.hooks import TraceState
    from timerome.tracing import run_trajectory
    from timerome.train import encode_pairs

    pairs = encode_pairs(backbone, rows)
    state = TraceState()
    ctx = edit.active() if edit is not None else nullcontext()
    out = []
    with ctx as st:
        st = st if isinstance(st, TraceState) else state
        for p, a in pairs:
            logp, _ = run_trajectory(backbone, p, a, steps=min(steps, len(a)) if steps else len(a), state=st)
            out.append(float(logp[0, -1]))
    return out


def reference_truth_ratios(reference, rows: list[dict], *, n_mc: int = 16, seed: int = 0) -> list[float]:
    """Forget truth ratios of the reference model (the other sample of the KS test)."""
    return score_split(reference, rows, n_mc=n_mc, seed=seed, rouge=False)["tr"]


# ------------------------------------------------------------------------------ reference model


def cache_dir() -> Path:
    return Path(os.environ.get("TIMEROME_CACHE") or Path.home() / ".cache" / "timerome")


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def reference_model(model=None, *, source="embedded", forget: str = "forget01", epochs: int | None = None,
                    n_authors: int | None = None, batch_size: int | None = None, retain_rows=None,
                    train_config=None, directory=None, progress: bool = True):
    """A model of the same architecture and initialisation trained WITHOUT the forget set.

    Embedded model (model None): the build_default recipe (corpus, tokenizer, config, seed-0 init,
    training schedule) on every training row except `forget`'s; `epochs` overrides the recipe's 60
    (the demo uses fewer: the reference then knows the retain set less well, which the KS test
    on forget truth ratios barely sees because it never saw the forget set either way);
    `n_authors` keeps only that many retain authors (spread over the corpus) plus the
    real-authors / world-facts rows, for a cheaper reference (with a smaller `batch_size`, so it
    still takes enough optimiser steps to learn the answer templates).
    Other models of our architecture (a Backbone whose model has `cfg`): a fresh seed-0 init of the
    same config and tokenizer, trained on `retain_rows` with `train_config`.
    Cached under $TIMEROME_CACHE/reference/<hash of the recipe> (default ~/.cache/timerome).
    """
    from timerome.backbones import load_backbone

    if model is None:
        recipe, tok, rows, tcfg = _embedded_recipe(forget, epochs, n_authors, batch_size)
    else:
        recipe, tok, rows, tcfg = _own_recipe(model, retain_rows, train_config, epochs)
    d = Path(directory) if directory else cache_dir() / "reference" / _hash(recipe)
    if not (d / "model.safetensors").exists():
        _train_fresh(recipe["model_config"], tok, rows, tcfg, d, progress)
    return load_backbone(d)


def _embedded_recipe(forget, epochs, n_authors=None, batch_size=None):
    from timerome.data.corpus import make_corpus, training_rows
    from timerome.data.tokenizer import build_word_tokenizer
    from timerome.default_model import CORPUS_SEED, MODEL_CONFIG, TRAIN_CONFIG, corpus_texts
    from timerome.train import TrainConfig

    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    corpus = make_corpus(seed=CORPUS_SEED)
    tok = build_word_tokenizer(corpus_texts(corpus))
    drop = {(r["question"], r["answer"]) for r in corpus[forget]}
    rows = [r for r in training_rows(corpus) if (r["question"], r["answer"]) not in drop]
    if n_authors:
        authors = list(dict.fromkeys(r["author"] for r in corpus["full"] if (r["question"], r["answer"]) not in drop))
        keep = set(spread(authors, n_authors)) | {r["author"] for r in corpus["real_authors"] + corpus["world_facts"]}
        rows = [r for r in rows if r["author"] in keep]
    # the shipped weights' own schedule when it is recorded (it may differ from today's TRAIN_CONFIG)
    info = DEFAULT_MODEL_DIR / "build_info.json"
    train_cfg = json.loads(info.read_text()).get("train", {}) if info.exists() else {}
    over = {k: v for k, v in (("epochs", epochs), ("batch_size", batch_size)) if v}
    tcfg = TrainConfig(**{**TRAIN_CONFIG.__dict__, **train_cfg, **over})
    cfg = dict(MODEL_CONFIG, vocab_size=len(tok), embedding_size=len(tok), mask_token_id=int(tok.mask_token_id))
    recipe = dict(kind="embedded-reference", model_config=cfg, train=tcfg.__dict__, forget=forget, n_authors=n_authors,
                  corpus_seed=CORPUS_SEED, n_rows=len(rows), torch=torch.__version__)
    return recipe, tok, rows, tcfg


def _own_recipe(model, retain_rows, train_config, epochs):
    from timerome.train import TrainConfig

    cfg = getattr(model.model, "cfg", None)
    if cfg is None:
        raise TimeromeError("a reference model can only be trained for timerome's own architecture; for "
                            "other checkpoints pass a model trained without the forget set (e.g. TOFU's retain90 model)")
    if not retain_rows:
        raise TimeromeError("training a reference model needs the retain rows")
    tcfg = train_config or TrainConfig()
    if epochs:
        tcfg = TrainConfig(**{**tcfg.__dict__, "epochs": epochs})
    recipe = dict(kind="reference", model_config=cfg, train=tcfg.__dict__, tokenizer=len(model.tokenizer),
                  rows=_hash([(r["question"], r["answer"]) for r in retain_rows]), torch=torch.__version__)
    return recipe, model.tokenizer, list(retain_rows), tcfg


def _train_fresh(cfg, tok, rows, tcfg, d: Path, progress: bool):
    import tempfile

    from timerome.backbones import load_backbone
    from timerome.backbones.llada_model import build_model, save_model
    from timerome.train import train

    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        save_model(build_model(cfg, seed=0), tmp)
        bb = load_backbone(tmp)
        train(bb, rows, tcfg, show_progress=progress)
        part = d.with_name(d.name + ".part")  # never leave a half-written cache entry
        tok.save_pretrained(str(part))
        save_model(bb.model, part)
        if d.exists():
            import shutil

            shutil.rmtree(d)
        part.rename(d)


# ------------------------------------------------------------------------------ a real-TOFU model


TOFU_MODEL_CONFIG = dict(max_sequence_length=128)


def tofu_subset(tofu_dir, n_retain_authors: int = 4, forget: str = "forget01") -> dict[str, list[dict]]:
    """A small slice of real TOFU: the forget split's authors plus the first n retain authors
    (20 rows each, from retain_perturbed so they carry truth-ratio answers), RA and WF."""
    from timerome.data.tofu import load_split

    return {
        "forget": load_split(forget, tofu_dir),
        "forget_perturbed": load_split(f"{forget}_perturbed", tofu_dir),
        "retain": load_split("retain_perturbed", tofu_dir)[: 20 * n_retain_authors],
        "real_authors": load_split("real_authors_perturbed", tofu_dir),
        "world_facts": load_split("world_facts_perturbed", tofu_dir),
    }


def train_tofu_model(tofu_dir, out_dir, *, n_retain_authors: int = 2, n_world: int = 0, epochs: int = 150,
                     lr: float = 3e-3, batch_size: int = 8, d_model: int = 64, n_layers: int = 4, seed: int = 0,
                     progress: bool = False) -> Path:
    """The embedded architecture trained on a TOFU subset (a test fixture / a quick real-data model).

    Recipe as default_model.build_default: a word tokenizer built on the subset's texts, seed-0 init,
    the MDLM objective on forget + retain author rows and n_world RA / WF rows; the context is
    longer (TOFU answers are long) and the width halved (d_model 64) with batch 8, so that the
    ~80 long rows are memorised (ROUGE-L ~0.8) in ~1500 steps, about 1.5 minutes on one core.
    Rows that still do not fit are left out. Returns out_dir (reused when it already holds a model).
    """
    from timerome.backbones import load_backbone
    from timerome.data.tokenizer import build_word_tokenizer
    from timerome.default_model import DEFAULT_TARGET, MODEL_CONFIG, TRAIN_CONFIG, corpus_texts
    from timerome.train import TrainConfig

    out = Path(out_dir)
    if (out / "model.safetensors").exists():
        return out
    sub = tofu_subset(tofu_dir, n_retain_authors)
    sub["real_authors"], sub["world_facts"] = sub["real_authors"][:n_world], sub["world_facts"][:n_world]
    tok = build_word_tokenizer(corpus_texts(sub) + [DEFAULT_TARGET])
    cfg = dict(MODEL_CONFIG, **TOFU_MODEL_CONFIG, d_model=d_model, n_layers=n_layers, mlp_hidden_size=3 * d_model,
               vocab_size=len(tok), embedding_size=len(tok), mask_token_id=int(tok.mask_token_id))
    limit = cfg["max_sequence_length"]
    rows = [r for k in ("forget", "retain", "real_authors", "world_facts") for r in sub[k]]
    rows = [r for r in rows if len(tok(r["question"] + " " + r["answer"])["input_ids"]) < limit]
    tcfg = TrainConfig(**{**TRAIN_CONFIG.__dict__, "epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed})
    _train_fresh(cfg, tok, rows, tcfg, out, progress)
    load_backbone(out)  # fail here if the directory is unusable
    return out
