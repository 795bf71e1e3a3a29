"""memory/base.py: one base for every memory (the file, the switch, the model), and the registry of
saved formats that `memory_file.load_memory` reads any file through."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from timerome import TimeromeError
from timerome.memory import base
from timerome.memory.base import KINDS, TENSORS, Memory
from timerome.memory.codebook_memory import CodebookMemory
from timerome.memory.edit_memory import EditMemory
from timerome.memory.memory_file import file_kind, load_memory, memory_kind
from timerome.memory.rewrite_memory import RewriteMemory


def memory(bb, n=3):
    g = torch.Generator().manual_seed(0)
    U = torch.randn(n, bb.hidden_size, generator=g, dtype=torch.float64)
    D = torch.randn(n, bb.hidden_size, generator=g, dtype=torch.float64)
    return EditMemory(bb, (1, "resid"), key_metric="paper", lam_absolute=1.0).add_vectors(U, D, [f"f{i}" for i in range(n)])


def n_hooks(bb):
    return sum(len(m._forward_hooks) for m in bb.model.modules())


def test_every_saved_format_names_its_class():
    assert KINDS[EditMemory.FORMAT] is EditMemory and all(KINDS[f] is EditMemory for f in EditMemory.OLD_FORMATS)
    assert KINDS[CodebookMemory.FORMAT] is CodebookMemory and KINDS[RewriteMemory.FORMAT] is RewriteMemory
    assert {c.KIND for c in KINDS.values()} == {"edit", "codebook", "rewrite"}
    assert memory_kind({"format": RewriteMemory.FORMAT}) == "rewrite"
    assert memory_kind({"format": "no-such-format"}) == "edit"      # its loader then says what is wrong
    for cls in (EditMemory, CodebookMemory, RewriteMemory):
        assert TENSORS[cls.FORMAT] == cls.SCHEMA


def test_save_and_load_through_the_base(tiny_bb, tmp_path):
    m = memory(tiny_bb)
    path = m.save(tmp_path / "m.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["timerome"])
    keys = list(meta)
    assert keys[:5] == ["format", "fingerprint", "backbone", "hidden_size", "coordinate"] and keys[-1] == "sha256"
    assert meta["causal"] is False  # the attention its keys were read under (an MDLM's: bidirectional)
    assert meta["prompt_start"] == [] and meta["checkpoint"] == str(Path(tiny_bb.info["checkpoint"]).resolve())
    assert meta["format"] == EditMemory.FORMAT and file_kind(path) == "edit"
    back = load_memory(path, tiny_bb)
    assert type(back) is EditMemory and back.fact_ids == m.fact_ids and back.coordinate == m.coordinate
    torch.testing.assert_close(back.ridge.U, m.ridge.U, rtol=0, atol=0)
    h = torch.randn(5, tiny_bb.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(back.delta(h), m.delta(h))


def test_a_load_option_the_memory_does_not_take_is_refused(tiny_bb, tmp_path):
    path = memory(tiny_bb).save(tmp_path / "m.safetensors")
    with pytest.raises(TimeromeError, match="takes no load option calibration"):
        EditMemory.load(path, tiny_bb, calibration=["text"])
    assert type(load_memory(path, tiny_bb, calibration=["text"])) is EditMemory  # load_memory passes what it takes


def test_the_switch_checks_the_model_and_leaves_nothing_behind(tiny_bb, tiny_other_bb, tmp_path):
    m = memory(tiny_bb)
    before = n_hooks(tiny_bb)
    with m.applied(tiny_bb):
        assert n_hooks(tiny_bb) == before + 1
    assert n_hooks(tiny_bb) == before
    with pytest.raises(TimeromeError, match="this edit memory was built for another model"):
        with m.applied(tiny_other_bb):
            pass
    with pytest.raises(TimeromeError, match="another model"):
        load_memory(m.save(tmp_path / "m.safetensors"), tiny_other_bb)


def test_a_new_memory_class_registers_its_format_and_tensors():
    try:
        class Probe(Memory):
            FORMAT, KIND, WHAT = "probe-memory/1", "probe", "probe memory"
            SCHEMA = {"x": (torch.float64, 1, True)}

        assert KINDS["probe-memory/1"] is Probe and TENSORS["probe-memory/1"] == Probe.SCHEMA
        assert Probe.formats() == ("probe-memory/1",)
    finally:
        base.KINDS.pop("probe-memory/1", None)
        base.TENSORS.pop("probe-memory/1", None)


def test_a_memory_read_under_the_other_attention_is_refused(tiny_bb, tmp_path):
    """The same weights read as an autoregressive model (--family llama on DiffuLLaMA) or the reverse:
    the fingerprint is the same, the keys are states of the other attention; refused on load and apply."""
    from safetensors.torch import load_file, save_file

    from timerome import TimeromeError

    m = memory(tiny_bb)
    path = m.save(tmp_path / "m.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["timerome"])
    meta["causal"] = True  # as a build on the causal reading of these weights writes it
    save_file(load_file(str(path)), str(tmp_path / "c.safetensors"), metadata={"timerome": json.dumps(meta)})
    with pytest.raises(TimeromeError, match="read as an autoregressive .* other attention"):
        load_memory(tmp_path / "c.safetensors", tiny_bb)
    m.causal = True
    with pytest.raises(TimeromeError, match="other attention"):
        with m.applied(tiny_bb):
            pass
    del meta["causal"]  # a file saved before the field: its fingerprint alone decides
    save_file(load_file(str(path)), str(tmp_path / "old.safetensors"), metadata={"timerome": json.dumps(meta)})
    assert load_memory(tmp_path / "old.safetensors", tiny_bb).causal is False
