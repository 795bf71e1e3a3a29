"""What a notebook user of the Python API met (stop 59's audit): silent no-ops and deep tracebacks,
now one TimeromeError each, and the plain cases still working."""

import pytest
import torch

import timerome
from timerome import TimeromeError
from timerome.methods import install


@pytest.fixture(scope="module")
def bb():
    return timerome.load_backbone()


@pytest.fixture(scope="module")
def task():
    return timerome.forget_task("embedded", "forget01")


def test_a_memory_of_one_step_refuses_a_generation_that_never_reaches_it(bb, task):
    mem = timerome.EditMemory(bb, timerome.Coordinate(1, "resid"), step=5, alpha=50.0).add(task.facts[:4])
    q = torch.tensor([bb.encode("Where was Isgor Quielson born ?")])
    plain = timerome.generate(bb, q, steps=8, gen_length=8, block_length=8)
    with mem.applied(bb):
        edited = timerome.generate(bb, q, steps=8, gen_length=8, block_length=8)  # step 5 of 8: it acts
        with pytest.raises(TimeromeError, match="acts at denoising step 5 only, and this generation takes 4 steps"):
            timerome.generate(bb, q, steps=4, gen_length=8, block_length=8)  # ran unedited before, silently
    assert not torch.equal(plain, edited)
    assert torch.equal(timerome.generate(bb, q, steps=4, gen_length=8, block_length=8),
                       timerome.generate(bb, q, steps=4, gen_length=8, block_length=8))  # no memory: runs


def test_an_undone_inference_edit_is_refused_and_install_wants_a_task(bb, task):
    edit = install("timerome", bb, task, {"coordinate": [1, "resid"]}, 0)
    with edit.active():
        pass
    edit.undo()
    with pytest.raises(TimeromeError, match="was undone"):
        with edit.active():
            pass
    with pytest.raises(TimeromeError, match="task must be a ForgetTask"):
        install("timerome", bb, task.facts)


def test_heatmaps_take_a_coordinate_and_refuse_a_folder(bb, task, tmp_path):
    r = timerome.trace(bb, task.facts[:2], steps=3, n_samples=1, seed=0, progress=False)
    assert timerome.plot_heatmaps(r, tmp_path / "h.png", selected=timerome.Coordinate(1, "resid", 0)).stat().st_size
    with pytest.raises(TimeromeError, match="not a cell of this trace"):
        timerome.plot_heatmaps(r, tmp_path / "h2.png", selected=timerome.Coordinate(1, "resid"))
    with pytest.raises(TimeromeError, match="is a folder"):
        timerome.plot_heatmaps(r, tmp_path)


def test_evaluation_inputs_that_read_nothing_or_everything(bb):
    with pytest.raises(TimeromeError, match="the forget split is empty"):
        timerome.evaluate(bb, {"forget": []}, n_mc=2, rouge=False)
    for split in ("retain90", "full"):  # its retain rows are forget rows: forgotten and preserved at once
        with pytest.raises(TimeromeError, match="retain rows are rows of the forget split"):
            timerome.forget_task("embedded", split)
    for bad, why in (({"seed": -1}, "seed"), ({"rouge": "no"}, "rouge must be True or False")):
        with pytest.raises(TimeromeError, match=why):
            timerome.evaluate_benchmark(bb, "wmdp", limit=1, n_mc=1, **bad)


def test_hooks_sites_a_blind_mask_and_a_fact_without_id(bb):
    with pytest.raises(TimeromeError, match="keep takes a list of sites"):
        timerome.Hooks(bb, keep="resid")
    with pytest.raises(TimeromeError, match="keep takes a list of sites"):
        timerome.Hooks(bb, keep=(1, "resid"))  # one site, not a list of them
    q = torch.tensor([bb.encode("Where was Isgor Quielson born ?")])
    with pytest.raises(TimeromeError, match="hides every prompt token of row 0"):
        timerome.generate(bb, q, steps=4, gen_length=4, block_length=4,
                          attention_mask=torch.zeros(1, q.shape[1], dtype=torch.bool))
    from timerome.data.facts import Fact
    with pytest.raises(TimeromeError, match="fact 'Where is it \\?': subject 'Nobody' is not in the prompt"):
        Fact("Nobody", "Where is it ?", "here")
