"""The benchmark tests' data folder and their small models (`timerome.training.small_model`). Nothing
here is a copy of benchmark text: rows are read at test time from the shared data folder
(../shared/data, else /work/shared/data)."""

import os
from pathlib import Path

import pytest


def find_bench() -> Path:
    """The shared benchmark data: $TIMEROME_TEST_BENCH, the checkout's ../shared/data, or /work's."""
    here = Path(__file__).resolve().parents[2]
    for p in (os.environ.get("TIMEROME_TEST_BENCH"), here / "shared" / "data", "/work/shared/data"):
        if p and (Path(p) / "muse").is_dir() and (Path(p) / "rwku").is_dir():
            return Path(p)
    return here / "shared" / "data"


BENCH = find_bench()
needs_bench = pytest.mark.skipif(not (BENCH / "muse").is_dir(), reason=f"no benchmark data (muse/, whp/, wmdp/, "
                                                                       f"rwku/) in {BENCH}")
