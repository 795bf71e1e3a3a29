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


def test_trace_and_selection_arguments_that_were_taken_silently(bb, task):
    """Stop 61's audit of the trace: positional_trace saved seed -1 and truncated 1.5; layers=[True]
    traced layer 1; tau -5 turned the decay into growth; modules="mlpattn" matched as a substring and a
    misspelt module was left out; top=True was 1; neighbours traced at their own noise scale were
    penalised against the facts' as if alike."""
    from timerome.tracing.positional_trace import positional_trace

    for kw, match in ((dict(seed=-1), "seed"), (dict(seed=1.5), "seed"), (dict(layers=[True]), "layers")):
        with pytest.raises(TimeromeError, match=match):
            positional_trace(bb, task.facts[:1], n_samples=1, progress=False, **kw)
    with pytest.raises(TimeromeError, match="load_backbone"):
        positional_trace("x", task.facts[:1])
    with pytest.raises(TimeromeError, match="tau"):
        timerome.trace(bb, task.facts[:1], tau=-5, progress=False)
    r = timerome.trace(bb, task.facts[:2], steps=3, n_samples=1, seed=0, progress=False)
    for modules in ("mlpattn", ("resid", "bogus")):
        with pytest.raises(TimeromeError, match="covers modules resid, attn, mlp, not"):
            timerome.select_coordinate(r, modules=modules)
    assert timerome.select_coordinate(r, modules="resid").best.module == "resid"  # one name is one module
    with pytest.raises(TimeromeError, match="top must be"):
        timerome.select_coordinate(r, top=True)
    own_sigma = timerome.trace(bb, task.facts[2:4], steps=3, n_samples=1, seed=0, progress=False,
                               sigma=1.1 * r.settings["sigma"])  # as the s3 rule gives other subjects their own
    with pytest.raises(TimeromeError, match="neighbour trace has sigma"):
        timerome.select_coordinate(r, own_sigma, beta=1.0)
    alike = timerome.trace(bb, task.facts[2:4], steps=3, n_samples=1, seed=0, progress=False,
                           sigma=r.settings["sigma"])
    assert timerome.select_coordinate(r, alike, beta=0.5).best.neighbour_abs_tie >= 0
    from timerome.methods import method_config

    with pytest.raises(TimeromeError, match="select_modules attn is not traced"):  # was refused after the trace
        method_config("timerome", dict(trace_modules=["resid"], select_modules=["resid", "attn"]))


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


def test_a_kept_site_is_found_by_any_spelling_of_it(bb):
    """tr[Coordinate(1, "resid")] missed an entry kept as (1, "resid") (KeyError), and a list site was
    unhashable; each spelling of a site now finds the one entry, a module site as before."""
    from timerome.engine.hooks import Hooks

    ids = torch.tensor([bb.encode("Where was Isgor Quielson born ?")])
    mlp = bb.module(0, "mlp")
    for kept in ((1, "resid"), timerome.Coordinate(1, "resid"), [1, "resid"]):
        with torch.no_grad(), Hooks(bb, keep=[kept, mlp]) as tr:
            bb.logits(ids)
        for spelling in ((1, "resid"), timerome.Coordinate(1, "resid"), [1, "resid"],
                         timerome.Coordinate(1, "resid", -1)):
            assert spelling in tr and tr[spelling][0].shape == (1, ids.shape[1], bb.hidden_size)
            assert tr.get(spelling) is tr[(1, "resid")]
        assert len(tr) == 2 and len(tr[mlp]) == 1
        assert (2, "resid") not in tr and timerome.Coordinate(1, "resid", 3) not in tr and tr.get([2, "resid"]) is None
        with pytest.raises(KeyError):
            tr[timerome.Coordinate(1, "mlp")]
    with torch.no_grad(), Hooks(bb, keep=[(1, "resid"), timerome.Coordinate(1, "resid")]) as tr:  # one site, one entry
        bb.logits(ids)
    assert list(tr) == [(1, "resid")] and len(tr[timerome.Coordinate(1, "resid")]) == 1


def test_a_forget_quality_of_too_few_reference_values_says_so(bb):
    """A one-value reference gave a KS p-value without a word; the notes now say how many values it
    compared (the CLI prints and --json writes every note), and an empty reference is refused."""
    from timerome.evaluation.evaluator import eval_rows, few_compared

    forget = eval_rows("embedded")["forget"]
    one = timerome.evaluate(bb, {"forget": forget[:3]}, n_mc=1, rouge=False, reference_tr=[0.5])
    assert one["metrics"]["ForgetQuality"] == one["metrics"]["ForgetQuality"]  # a number, with a note beside it
    assert one["notes"]["ForgetQuality"].startswith("the KS test compared the model's 3 forget truth ratios with 1 "
                                                    "of the reference model's, fewer than the forget rows")
    enough = timerome.evaluate(bb, {"forget": forget[:3]}, n_mc=1, rouge=False, reference_tr=[0.2, 0.5, 0.9])
    assert "ForgetQuality" not in enough["notes"]
    single = timerome.evaluate(bb, {"forget": forget[:1]}, n_mc=1, rouge=False, reference_tr=[0.5])
    assert "fewer than 2 values on a side" in single["notes"]["ForgetQuality"]
    assert few_compared(20, 20) is None and "with 19 of" in few_compared(20, 19)
    with pytest.raises(TimeromeError, match="reference_tr must be a non-empty list"):
        timerome.evaluate(bb, {"forget": forget[:3]}, n_mc=1, rouge=False, reference_tr=[])


def test_a_prompt_on_the_meta_device_is_refused_in_one_line(bb):
    """A meta tensor holds no ids to move to the model's device: generate raised torch's RuntimeError
    (Tensor.item() cannot be called on meta tensors), log_likelihood said it was not a list of ids."""
    q = torch.tensor([bb.encode("Where was Isgor Quielson born ?")]).to("meta")
    with pytest.raises(TimeromeError, match="meta device.*cpu"):
        timerome.generate(bb, q, steps=2, gen_length=2, block_length=2)
    with pytest.raises(TimeromeError, match="meta device.*cpu"):
        timerome.log_likelihood(bb, q, [5], n_mc=1)


def test_evaluate_says_when_the_memory_asks_only_some_forget_rows(bb, task):
    """The CLI said so (eval --edit); the API's evaluate now does, in its notes."""
    mem = timerome.EditMemory(bb, timerome.Coordinate(1, "resid")).add(task.facts[:1])
    rows = {"forget": task.forget_rows[:2]}
    got = timerome.evaluate(bb, rows, n_mc=1, edit=mem, truth_ratio=False, rouge=False)
    assert got["notes"]["ForgetLP"].startswith("the edit's memory holds 1 facts; 1 of the 2 forget rows")
    whole = timerome.evaluate(bb, {"forget": task.forget_rows[:1]}, n_mc=1, edit=mem, truth_ratio=False, rouge=False)
    assert "ForgetLP" not in whole["notes"]


def test_removing_facts_inside_applied_is_refused_and_remove_takes_ids_only(bb, task):
    """A rewrite memory's gate remembers each prompt's fact by its place: a remove inside `applied` made it
    answer with the next fact's target, or raise IndexError (helper 34). Every memory refuses it now, as
    add already was refused there; remove(None) is one line for every kind."""
    mem = timerome.EditMemory(bb, timerome.Coordinate(1, "resid")).add(task.facts[:3])
    with mem.applied(bb):
        with pytest.raises(TimeromeError, match="applied to its model.*remove facts outside it"):
            mem.remove([task.facts[0].fact_id])
    assert len(mem.remove([task.facts[0].fact_id])) == 2  # outside: as before
    with pytest.raises(TimeromeError):
        mem.remove(None)


def test_selection_and_heatmaps_refuse_what_is_not_a_trace_and_heatmaps_read_a_saved_one(bb, task, tmp_path):
    """select_coordinate("x") / (None), per_fact_best and runner_up of a non-trace raised AttributeError; plot_heatmaps
    of a path did too, and now reads the saved trace (TraceResult.load)."""
    from timerome.tracing.selection import per_fact_best, runner_up

    r = timerome.trace(bb, task.facts[:2], steps=2, n_samples=1, seed=0, progress=False)
    for bad in ("x", None):
        with pytest.raises(TimeromeError, match="select_coordinate's result must be a TraceResult"):
            timerome.select_coordinate(bad)
    with pytest.raises(TimeromeError, match="per_fact_best's result must be a TraceResult.*TraceResult.load"):
        per_fact_best("x")
    with pytest.raises(TimeromeError, match="runner_up's result must be a TraceResult"):
        runner_up([r], timerome.select_coordinate(r).best)
    with pytest.raises(TimeromeError, match="no trace result at .*t3.safetensors"):
        timerome.plot_heatmaps(tmp_path / "t3.safetensors", tmp_path / "x.png")
    with pytest.raises(TimeromeError, match="plot_heatmaps's result must be a TraceResult"):
        timerome.plot_heatmaps(5, tmp_path / "x.png")
    saved = r.save(tmp_path / "t")
    assert timerome.plot_heatmaps(str(saved), tmp_path / "h.png").read_bytes() == \
        timerome.plot_heatmaps(r, tmp_path / "h2.png").read_bytes()


def test_a_trace_saved_to_a_folder_is_refused_not_written_beside_it(bb, task, tmp_path):
    r = timerome.trace(bb, task.facts[:1], steps=2, n_samples=1, seed=0, progress=False)
    (tmp_path / "adir").mkdir()
    with pytest.raises(TimeromeError, match="the trace file .*adir is a directory; pass a file name"):
        r.save(tmp_path / "adir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]  # no adir.safetensors / adir.json beside it


def test_reference_truth_ratios_wants_a_model_and_forget_rows(bb):
    from timerome.evaluation.evaluator import eval_rows

    rows = eval_rows("embedded")["forget"][:2]
    with pytest.raises(TimeromeError, match="reference_truth_ratios's reference must be a model.*load_backbone"):
        timerome.reference_truth_ratios("embedded", rows)
    for bad in ([], "forget", {"forget": rows}):
        with pytest.raises(TimeromeError, match="reference_truth_ratios's rows must be a non-empty list of forget"):
            timerome.reference_truth_ratios(bb, bad)
    no_pert = {k: v for k, v in rows[0].items() if k != "perturbed_answer"}
    for bad in ({"q": 1}, no_pert, "a row"):
        with pytest.raises(TimeromeError, match=r"reference_truth_ratios's rows\[1\] must be a row with 'question'"):
            timerome.reference_truth_ratios(bb, [rows[0], bad])
    with pytest.raises(TimeromeError, match="n_mc"):
        timerome.reference_truth_ratios(bb, rows, n_mc=0)


def test_log_likelihood_requests_and_requests_task_refuse_a_wrong_kind_of_argument():
    with pytest.raises(TimeromeError, match="log_likelihood's backbone must be a model from timerome.load_backbone"):
        timerome.log_likelihood(None, [1], [2])
    with pytest.raises(TimeromeError, match="requests spec must be a file path, a corpus spec .* got int 5"):
        timerome.load_requests(5)
    with pytest.raises(TimeromeError, match="requests must be a list of edit requests: requests, notes = "
                                            "load_requests\\(spec\\)"):
        timerome.requests_task("counterfactual:forget10")
    loaded = timerome.load_requests("counterfactual:forget10", limit=2)
    with pytest.raises(TimeromeError, match="requests must be a list of edit requests"):
        timerome.requests_task(loaded)  # the (requests, notes) pair, not the requests
    assert len(timerome.requests_task(iter(loaded[0])).facts) == 2


def test_an_edit_function_returning_another_shape_is_refused_naming_its_site(bb):
    ids = torch.tensor([bb.encode("Where was Isgor Quielson born ?")])
    for fn, got in ((lambda h, s: h[:, :2], r"a tensor of shape \(1, 2, "), (lambda h, s: 0.0, "got float")):
        with pytest.raises(TimeromeError, match=f"the edit function at layer 1 resid must return a tensor of its "
                                                f"input's shape \\(1, {ids.shape[1]}, {bb.hidden_size}\\).*{got}"):
            with torch.no_grad(), timerome.Hooks(bb, edit={(1, "resid"): fn}):
                bb.logits(ids)
    with torch.no_grad(), timerome.Hooks(bb, edit={timerome.Coordinate(1, "resid"): lambda h, s: h * 1.0}):
        bb.logits(ids)  # the same shape: taken


def test_a_missing_local_path_is_not_taken_for_a_hub_id(tmp_path):
    """A mistyped .gguf file or folder path was sent to the Hub and answered "could not be fetched from the
    Hub": it is a path that does not exist (review 74)."""
    for path in (tmp_path / "nope.gguf", str(tmp_path / "nope"), "nope.gguf", "./nope", "a/b/c"):
        with pytest.raises(TimeromeError, match="does not exist: pass a checkpoint folder"):
            timerome.load_backbone(path)


def test_generate_on_an_autoregressive_model_refuses_steps_and_blocks_it_would_ignore(tmp_path):
    """The command line refused --steps / --block-length on an AR model; the API took steps=2, block_length=2 and
    gave the answer of the defaults (review 74). The defaults, and gen_length for both, still run."""
    from timerome.backbones.tiny import make_tiny_checkpoint

    bb = timerome.load_backbone(make_tiny_checkpoint("llama", tmp_path / "ar"))
    plain = timerome.generate(bb, "the author was born in", gen_length=8)
    assert torch.equal(plain, timerome.generate(bb, "the author was born in", gen_length=8, steps=8, block_length=8))
    for kw, named in (({"steps": 2}, "steps 2"), ({"block_length": 4}, "block_length 4"),
                      ({"steps": 2, "block_length": 2}, "steps 2 and block_length 2")):
        with pytest.raises(TimeromeError, match=f"{named}: the llama model is autoregressive"):
            timerome.generate(bb, "the author was born in", gen_length=8, **kw)
    # continuations (MUSE's verbmem, 64 / 128 tokens) sized its blocks at 32 and met that refusal (review 76)
    from timerome.engine.sampler import continuations

    assert len(continuations(bb, ["the author was born in"], gen_length=64)["texts"]) == 1
