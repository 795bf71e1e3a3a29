"""The memory tests' models: a tiny random 3-layer checkpoint, and another one (seed 1) a memory must refuse.
A test file that needs another model defines its own `bb`."""

import pytest

from timerome import load_backbone
from timerome.backbones.tiny import make_tiny_checkpoint


@pytest.fixture(scope="module")
def bb(tmp_path_factory):
    return load_backbone(make_tiny_checkpoint("timerome", tmp_path_factory.mktemp("tiny") / "m", layers=3))


@pytest.fixture(scope="module")
def other_bb(tmp_path_factory):
    return load_backbone(make_tiny_checkpoint("timerome", tmp_path_factory.mktemp("tiny2") / "m", layers=3, seed=1))
