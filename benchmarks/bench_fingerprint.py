"""What the full-weight fingerprint costs: every byte of every weight hashed (and checked finite) once per
checkpoint, then read from the cache by the files' size and modification time.

    python benchmarks/bench_fingerprint.py                     # the embedded model and a ~0.9 GB random one
    python benchmarks/bench_fingerprint.py --d-model 1024 --layers 2

For each model it prints, in one run (fresh cache folder):
  load, first     load_backbone with an empty cache: the weights read, built, hashed and checked
  hash alone      weights_digest over the loaded model (what the first load added)
  load, cached    the same load again: the digest read from the cache, nothing hashed
and the ratios hash / first load and cached / first load. A second load should cost what a load
without any fingerprint costs: the cached ratio is the goal (near 1 - hash share).

"first" means an empty fingerprint cache, not a cold disk: the random checkpoint was just written, so
its bytes are in the operating system's page cache, and a checkpoint read from disk for the first time
takes longer (the hash share is then smaller than printed, the cached ratio too).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from timerome.errors import script


def timed(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def random_checkpoint(folder: Path, d_model: int, layers: int) -> Path:
    """A random LLaDA-structure model in the embedded model's layout and tokenizer."""
    from timerome.backbones.llada_model import build_model, save_model
    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(d_model=d_model, n_layers=layers, n_heads=max(1, d_model // 64), n_kv_heads=max(1, d_model // 64),
               mlp_hidden_size=3 * d_model)
    (folder / "model.safetensors").unlink()
    save_model(build_model(cfg, seed=0), folder)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=2048, help="the random model's width")
    ap.add_argument("--layers", type=int, default=4, help="the random model's blocks")
    ap.add_argument("--repeats", type=int, default=3, help="timed cached loads (median)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-fingerprint-"))
    os.environ["TIMEROME_CACHE"] = str(work / "cache")
    from timerome.backbones import load_backbone
    from timerome.backbones.backbone import weights_digest
    from timerome.backbones.loading import DEFAULT_MODEL_DIR
    from timerome.common.threads import setting

    try:
        models = {"embedded": DEFAULT_MODEL_DIR,
                  "random": random_checkpoint(work / "random", args.d_model, args.layers)}
        load_backbone(DEFAULT_MODEL_DIR)  # imports and tokenizer start-up, into another cache folder
        os.environ["TIMEROME_CACHE"] = str(work / "cache-timed")
        print(setting())
        print(f"{'model':10} {'weights':>10} {'load, first':>12} {'hash alone':>11} {'load, cached':>13} "
              f"{'hash/first':>11} {'cached/first':>13}")
        for name, path in models.items():
            size = sum(p.stat().st_size for p in Path(path).glob("*.safetensors"))
            t0 = time.perf_counter()
            bb = load_backbone(path)
            first = time.perf_counter() - t0
            alone = timed(lambda m=bb.model, c=bb.config: weights_digest(m, c), args.repeats)
            cached = timed(lambda: load_backbone(path), args.repeats)
            print(f"{name:10} {size / 2**20:8.1f}MB {first:11.3f}s {alone:10.3f}s {cached:12.3f}s "
                  f"{alone / first:11.2f} {cached / first:13.2f}")
            del bb
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(script(main))
