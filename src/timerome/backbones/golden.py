"""The golden backbone fixtures: where they are, the cases they hold, and the official code's own bf16 spread.

`../shared/fixtures/backbones/<family>/` (beside a checkout) holds, per family, a tiny checkpoint laid out
as the release and the official modelling code's fp32 outputs on it (logits, embedding, per-layer block /
attention / MLP outputs, a padded case): data the conformance tests and `benchmarks/device_check.py` read.
One copy of what both need to find and name them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple


class Case(NamedTuple):
    folder: str      # under the fixtures' root
    checkpoint: str  # the checkpoint folder in it
    golden: str      # the official outputs: <golden>.safetensors
    family: str      # the family `load_backbone` must detect


CASES = {
    "llada": Case("llada", "checkpoint", "golden", "llada"),
    "mmada": Case("mmada", "checkpoint", "golden", "mmada"),
    "llada-moe": Case("llada-moe", "checkpoint", "golden", "llada-moe"),
    "llada-moe-shared": Case("llada-moe", "checkpoint-shared", "golden-shared", "llada-moe"),
    "dream": Case("dream", "checkpoint", "golden", "dream"),
    "diffullama": Case("diffullama", "checkpoint", "golden", "diffullama"),
}

# max |bf16 - fp32| of the official code's logits on the unpadded golden input (CPU, torch 2.13, official
# files at the commits the fixture READMEs name; measured by running them outside this repository, rounded
# up). The fixture READMEs do not state it yet.
OFFICIAL_BF16_VS_FP32 = {"llada": 0.051, "mmada": 0.049, "llada-moe": 0.027, "llada-moe-shared": 0.28,
                         "dream": 0.037, "diffullama": 0.060}

ENV = "TIMEROME_TEST_FIXTURES"


def search_roots(checkout: Path) -> list[Path]:
    """Where the fixtures are looked for, in order: $TIMEROME_TEST_FIXTURES, the fixtures beside the
    checkout (its ../shared/fixtures), /work/shared/fixtures; each as given or with /backbones under it."""
    roots = [os.environ.get(ENV), Path(checkout).resolve().parent / "shared" / "fixtures", "/work/shared/fixtures"]
    return [c for p in roots if p for c in (Path(p) / "backbones", Path(p))]


def find_root(checkout: Path) -> Path | None:
    """The first of `search_roots` holding the llada case's golden file, or None."""
    first = CASES["llada"]
    return next((r for r in search_roots(checkout) if (r / first.folder / f"{first.golden}.safetensors").exists()),
                None)


def paths(root: Path, case: str) -> tuple[Path, Path]:
    """(checkpoint folder, golden safetensors file) of a case under the fixtures' root."""
    c = CASES[case]
    return root / c.folder / c.checkpoint, root / c.folder / f"{c.golden}.safetensors"
