"""The edit's scale (memory/scale.py): an update that overflows the model is refused and one that swamps the
residual is warned about, on every path, the Python API's included (it scored such a memory silently)."""

import pytest
import torch

import timerome
from timerome import TimeromeError
from timerome.data.task import forget_task
from timerome.memory.scale import check_on_keys


@pytest.fixture(scope="module")
def bb():
    return timerome.load_backbone()


@pytest.fixture(scope="module")
def facts():
    return forget_task("embedded").facts[:4]


def test_applying_an_overflowing_memory_is_refused_and_a_swamping_one_is_warned_about(bb, facts):
    memory = timerome.EditMemory(bb, (1, "resid")).add(facts)
    with memory.applied(bb):  # the default alpha: neither
        pass
    memory.alpha = 1e30
    with pytest.raises(TimeromeError, match=r"this edit memory makes the residual at layer 1 resid .*overflow "
                                            r"\(alpha 1e\+30\)"):
        with memory.applied(bb):
            pass
    memory.alpha = 2000.0
    with pytest.warns(UserWarning, match=r"changes the residual by up to \d+ times its size \(alpha 2000\)"):
        with memory.applied(bb):
            out = timerome.generate(bb, facts[0].prompt, steps=4, gen_length=4, block_length=4)
    assert out.shape[1] > 4


def test_a_check_passed_is_not_repeated_until_the_memory_changes(bb, facts):
    memory = timerome.EditMemory(bb, (1, "resid"), alpha=2000.0).add(facts[:2])
    with pytest.warns(UserWarning):
        check_on_keys(memory, bb, "m")
    assert memory._scale_checked == memory.scale_state()
    memory.add(facts[2:3])  # another version: checked again
    assert memory._scale_checked != memory.scale_state()


def test_the_gated_edit_is_checked_too(bb, facts):
    gated = timerome.GatedEdit.from_fact(bb, facts[0], (1, "resid"), alpha=1e30)
    with pytest.raises(TimeromeError, match="this gated edit makes the residual .*overflow"):
        with gated.applied(bb):
            pass
    with pytest.raises(TimeromeError, match="alpha must be a finite number >= 0"):
        timerome.GatedEdit(torch.ones(bb.hidden_size), torch.ones(bb.hidden_size), (1, "resid"), alpha=-1.0)


def test_a_negative_alpha_is_refused_by_the_memories_as_by_the_methods(bb):
    with pytest.raises(TimeromeError, match="alpha must be a finite number >= 0"):
        timerome.EditMemory(bb, (1, "resid"), alpha=-1.0)
    memory = timerome.EditMemory(bb, (1, "resid"))
    memory.alpha = -0.5  # alpha may be changed at any time; applying it checks it
    with pytest.raises(TimeromeError, match="alpha must be a finite number >= 0"):
        with memory.applied(bb):
            pass


def test_an_empty_memory_is_not_saved(bb, facts, tmp_path):
    """`timerome memory remove` refused removing every fact; the API saved the empty memory, which nothing applies."""
    memory = timerome.EditMemory(bb, (1, "resid")).add(facts[:1])
    memory.remove([facts[0].fact_id])
    with pytest.raises(TimeromeError, match="this edit memory is empty: an empty memory edits nothing"):
        memory.save(tmp_path / "empty.safetensors")
    assert not (tmp_path / "empty.safetensors").exists()


def test_the_prompt_check_reads_the_keys_too_and_keeps_no_float64_copy(bb, facts):
    """Review 63: prompts that never reach a gated memory's radii passed the check, and `applied` then skipped
    the keys'; the check's float64 pass left float64 copies of the hook's matrices in the memory's cache."""
    from timerome.memory.scale import check_on_prompts

    memory = timerome.EditMemory(bb, (1, "resid"), alpha=1e30).add(facts[:2])
    with pytest.raises(TimeromeError, match="overflow"):
        check_on_prompts(bb, memory, [], "m")  # no prompt at all: its keys still overflow
    memory.alpha = 1.0
    check_on_prompts(bb, memory, [bb.encode_prompt(facts[0].prompt)], "m")
    assert memory._scale_checked == memory.scale_state()
    with memory.applied(bb):
        pass
    assert [dtype for _, dtype in memory._cache] == [bb.dtype]


def test_a_gated_edits_alpha_changed_later_is_checked_when_applied(bb, facts):
    gated = timerome.GatedEdit.from_fact(bb, facts[0], (1, "resid"))
    gated.alpha = -5.0
    with pytest.raises(TimeromeError, match="alpha must be a finite number >= 0"):
        with gated.applied(bb):
            pass
