"""The lm-eval review's defects (stop 66): each test reproduces one and failed before its fix.

Offline, as test_lm_eval_model.py: task YAMLs over a local JSON-lines file in the test's tmp folder.
"""

import json
import sys
import time

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: pip install -e '.[test]' (or [eval])")

from lm_eval.utils import simple_parse_args_string  # noqa: E402

from timerome import TimeromeError, load_backbone  # noqa: E402
from timerome.data.tofu import load_split  # noqa: E402
from timerome.integrations import lm_eval_model as M  # noqa: E402
from timerome.integrations.lm_eval_model import (TimeromeLM, evaluate_tasks, greedy_readers, pair_seed,  # noqa: E402
                                                 task_manager)

N_MC = 2


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))


class Req:
    def __init__(self, *args):
        self.args = args


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """Four forget01 facts as a generation task (the answer, "Pellmoor ." written "Pellmoor." as the word-level
    tokenizer decodes it), a loglikelihood task (acc reads is_greedy), and multiple-choice tasks with and without
    exact_match; a loglikelihood task of perplexity alone and one scored by its own process_results."""
    folder = tmp_path_factory.mktemp("lmeval_fixes")
    docs = []
    for i, r in enumerate(load_split("forget01_perturbed", "embedded")[:4]):
        choices = [r["answer"]] + list(r["perturbed_answer"][:2])
        docs.append({"question": r["question"], "answer": r["answer"], "choices": choices, "gold": 0})
    data = folder / "items.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
              'doc_to_text: "{{question}}"\n')

    def metrics(*names):
        return "metric_list:\n" + "".join(f"  - metric: {n}\n" for n in names)

    mc = ('output_type: multiple_choice\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{gold}}"\n'
          'target_delimiter: " "\n')
    ll = 'output_type: loglikelihood\ndoc_to_target: " {{answer}}"\n'
    (folder / "gen.yaml").write_text("task: fx_gen\n" + common + "output_type: generate_until\n"
                                     "doc_to_target: \"{{answer | replace(' .', '.')}}\"\n"
                                     'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 12\n'
                                     + metrics("exact_match"))
    (folder / "ll.yaml").write_text("task: fx_ll\n" + common + ll + metrics("perplexity", "acc"))
    (folder / "ppl.yaml").write_text("task: fx_ppl\n" + common + ll + metrics("perplexity"))
    (folder / "mc.yaml").write_text("task: fx_mc\n" + common + mc + metrics("acc", "acc_norm"))
    (folder / "mcx.yaml").write_text("task: fx_mcx\n" + common + mc + metrics("acc", "exact_match"))
    (folder / "own.py").write_text("def score(doc, results):\n    return {'acc': float(results[0][1])}\n")
    (folder / "own.yaml").write_text("task: fx_own\n" + common.replace("doc_to_text", "process_results: !function "
                                                                        "own.score\ndoc_to_text") + mc
                                     + metrics("acc"))
    return folder


@pytest.fixture(scope="module")
def index(tasks):
    return task_manager([tasks])


# ------------------------------------------------------------------ 1. the answer's end


def test_a_generated_answer_ends_at_the_end_of_text_token_without_a_trailing_space(bb, monkeypatch):
    """The answer was decoded with its special tokens and cut at the text "<|eos|>": the word-level tokenizer
    writes "Pellmoor. <|eos|>", so the answer kept a space and exact_match read 0 on right answers."""
    answer = bb.encode("Isgor Quielson was born in Pellmoor .")
    eos = bb.tokenizer.eos_token_id
    assert bb.tokenizer.decode(answer + [eos], skip_special_tokens=False).endswith(". <|eos|>")  # the old cut's input

    def spy(backbone, prompt, **kw):  # the sampler's fill: the answer, end-of-text, then words past it
        tail = answer + [eos] + bb.encode("Tessaro") + [eos] * kw["gen_length"]
        return torch.cat([prompt, torch.tensor([tail[:kw["gen_length"]]])], 1)

    monkeypatch.setattr(M, "generate", spy)
    lm = TimeromeLM(backbone=bb, n_mc=N_MC)
    said = lm.generate_until([Req("Where was Isgor Quielson born ?", {"until": ["\n"], "max_gen_toks": 12}),
                              Req("Where was Isgor Quielson born ?", {"until": ["born"], "max_gen_toks": 12}),
                              Req("Where was Isgor Quielson born ?", {"until": "Pell", "max_gen_toks": 12})],
                             disable_tqdm=True)
    # cut at the first end-of-text id (nothing after it), then at the task's stop sequence, kept as written
    assert said == ["Isgor Quielson was born in Pellmoor.", "Isgor Quielson was ", "Isgor Quielson was born in "]


def test_exact_match_scores_the_right_generated_answers(bb, tasks, index):
    res = evaluate_tasks(TimeromeLM(backbone=bb, n_mc=N_MC), ["fx_gen"], include_path=[tasks], manager=index,
                         log_samples=True)
    samples = res["samples"]["fx_gen"]
    said = [s["filtered_resps"][0] for s in samples]
    assert all(t == t.rstrip() and "<|" not in t for t in said), said
    # the embedded model knows these facts: every answer is its target, word for word (it read 0 before)
    assert res["results"]["fx_gen"]["exact_match,none"] == 1.0, [(t, s["target"]) for t, s in zip(said, samples)]


# ------------------------------------------------------------------ 2. is_greedy where a score reads it


def test_which_tasks_read_is_greedy_is_decided_from_the_task(tasks, index):
    # loglikelihood acc and multiple-choice exact_match read it; a process_results of the task's own may;
    # acc / acc_norm of multiple choice, perplexity alone and generation never do
    assert greedy_readers(["fx_gen", "fx_ll", "fx_ppl", "fx_mc", "fx_mcx", "fx_own"], index) == \
        ["fx_ll", "fx_mcx", "fx_own"]

    class Older:  # an lm-eval before TaskManager.load (0.4.4 ..): the tasks come from get_task_dict
        def __init__(self, manager):
            self._manager = manager

        def __getattr__(self, name):
            if name == "load":
                raise AttributeError(name)
            return getattr(self._manager, name)

    with pytest.warns(DeprecationWarning):  # 0.4.13 keeps the older loader, deprecated
        assert greedy_readers(["fx_ll", "fx_mc"], Older(index)) == ["fx_ll"]
    with pytest.raises(TimeromeError, match="lm-eval could not run tasks fx_nope"):
        greedy_readers(["fx_nope"], index)


def test_lm_evals_own_truthfulqa_mc2_scoring_is_known_to_read_no_is_greedy():
    """truthfulqa_mc2 (a default utility task) scores with lm-eval's own process_results_mc2, which reads the
    log-likelihoods only: no is_greedy generation for it. The same name anywhere else is not taken on trust."""
    import importlib.util
    import os

    import lm_eval

    from timerome.integrations.lm_eval_model import _known_greedy_free

    path = os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "truthfulqa", "utils.py")
    spec = importlib.util.spec_from_file_location("utils", path)  # as lm-eval's `!function utils.x` loads it
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _known_greedy_free(module.process_results_mc2)

    def process_results_mc2(doc, results):  # a task of one's own, same name: may read is_greedy
        return {"acc": results[0][1]}

    assert not _known_greedy_free(process_results_mc2) and not _known_greedy_free(len)


def test_a_model_skipping_is_greedy_is_refused_where_a_score_reads_it(bb, tasks, index):
    """check_greedy=False answers is_greedy False: a loglikelihood task's acc read 0 whatever the model knew."""
    with pytest.raises(TimeromeError, match=r"score of fx_ll reads is_greedy .* leave check_greedy on"):
        evaluate_tasks(TimeromeLM(backbone=bb, n_mc=N_MC, check_greedy=False), ["fx_ll"], manager=index)
    res = evaluate_tasks(TimeromeLM(backbone=bb, n_mc=N_MC, check_greedy=False), ["fx_mc"], manager=index)
    assert res["results"]["fx_mc"]["acc,none"] >= 0.75  # a score that never reads it runs


def test_the_utility_scores_a_loglikelihood_task_as_lm_eval_does(bb, tasks, index, tmp_path):
    """`timerome experiment utility` checked is_greedy only for the config's greedy_tasks (lambada_openai): any other
    loglikelihood task's acc read 0 (lm-eval alone: 0.75 here)."""
    from timerome.experiments import run_experiment

    over = dict(tasks=["fx_ll", "fx_mc"], include_path=str(tasks), n_mc=N_MC, points=())
    res = run_experiment("utility", seeds=(0,), out_dir=tmp_path, overrides=over, progress=False, backbone=bb)
    direct = evaluate_tasks(TimeromeLM(backbone=bb, n_mc=N_MC), ["fx_ll"], manager=index)
    assert direct["results"]["fx_ll"]["acc,none"] >= 0.75  # the sampler's own fill is the answer, mostly
    assert res["summary"]["no_edit"]["fx_ll"]["mean"] == direct["results"]["fx_ll"]["acc,none"]
    assert res["summary"]["no_edit"]["fx_mc"]["mean"] >= 0.75
    with pytest.raises(TimeromeError, match="has no setting greedy_tasks any more: .* decided from each task"):
        run_experiment("utility", seeds=(0,), out_dir=tmp_path / "old", overrides=dict(over, greedy_tasks=[]),
                       progress=False, load=lambda path: pytest.fail("loaded"))


# ------------------------------------------------------------------ 3. an unknown task on lm-eval's command line


def test_a_mistyped_task_on_lm_evals_command_line_is_one_line(tasks, monkeypatch, capsys):
    """lm-eval raises ValueError("Tasks not found: ..."): it ended our entry point in a 17-line traceback."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "timerome", "--device", "cpu", "--include_path",
                                      str(tasks), "--tasks", "fx_mcc"])
    with pytest.raises(SystemExit) as stop:
        M.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: lm-eval could not run: Tasks not found: fx_mcc"]


# ------------------------------------------------------------------ 4. generation settings and yes / no values


def test_invalid_generation_settings_and_yes_no_values_are_refused(bb):
    """gen_length=0 ran the task's max_gen_toks (`or`), steps=0 and block_length=0 the same, and check_greedy=no
    counted as true (bool("no"))."""
    for name in ("gen_length", "steps", "block_length"):
        for bad in (0, -3, 2.5, "eight"):
            # "(or left out)": how a model_args user gives none (there is no null to write there)
            with pytest.raises(TimeromeError, match=rf"model_args {name} must be an integer >= 1 \(or left out\)"):
                TimeromeLM(backbone=bb, **{name: bad})
    # as lm-eval's command line passes them (true / false become bools, 1 / 0 ints, before we see them)
    assert TimeromeLM.create_from_arg_string("check_greedy=no,n_mc=2", {"device": "cpu"}).check_greedy is False
    for text, value in (("no", False), ("No", False), ("false", False), ("0", False), ("yes", True), ("TRUE", True),
                        ("1", True)):
        lm = TimeromeLM(backbone=bb, **simple_parse_args_string(f"check_greedy={text},n_mc=2"))
        assert lm.check_greedy is value, text
    for bad in ("nope", "flase", 2, 0.5, "", None):
        with pytest.raises(TimeromeError, match="model_args check_greedy must be true or false"):
            TimeromeLM(backbone=bb, check_greedy=bad)
    with pytest.raises(TimeromeError, match="model_args trust_remote_code must be true or false"):
        TimeromeLM(backbone=bb, trust_remote_code="sure")
    with pytest.raises(TimeromeError, match="the task's max_gen_toks must be an integer >= 1"):  # a task's 0 too
        TimeromeLM(backbone=bb).generate_until([Req("Q ?", {"until": ["\n"], "max_gen_toks": 0})], disable_tqdm=True)


def test_the_utility_refuses_an_invalid_generation_setting_before_loading(tmp_path):
    from timerome.experiments import run_experiment

    with pytest.raises(TimeromeError, match="the generation setting gen_length must be an integer >= 1"):
        run_experiment("utility", seeds=(0,), out_dir=tmp_path, progress=False, load=lambda path: pytest.fail("loaded"),
                       overrides=dict(tasks=["x"], generation={"gen_length": 0}))


# ------------------------------------------------------------------ 5. the cost of a cell is its own


def test_the_task_index_is_not_charged_to_the_first_cell(bb, tasks, index, tmp_path, monkeypatch):
    """The utility's first cell built lm-eval's task index (about 7 s) inside its clock: its wall s read 7.9 where
    the next read 0.9. A clock that jumps 1000 s while the index and the task decision are built shows where."""
    from timerome.experiments import run_experiment, utility

    real, jump = time.perf_counter, [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: real() + jump[0])

    def slow(build):
        def built(*a, **k):
            out = build(*a, **k)
            jump[0] += 1000.0
            return out
        return built

    monkeypatch.setattr(utility, "task_manager", slow(lambda include: index))
    monkeypatch.setattr(utility, "greedy_readers", slow(greedy_readers), raising=False)
    over = dict(tasks=["fx_mc"], include_path=str(tasks), n_mc=N_MC, points=({"alpha": 0.0, "q": 2},))
    res = run_experiment("utility", seeds=(0,), out_dir=tmp_path, overrides=over, progress=False, backbone=bb)
    assert [row["wall_seconds"]["mean"] < 1000.0 for row in res["summary"].values()] == [True, True]
    assert jump[0] == 2000.0  # each built once, for both cells


# ------------------------------------------------------------------ 6 and 7. the seed, the command that works


def test_lm_evals_seed_leaves_our_masks_and_the_docstring_says_so(bb, tasks, index):
    """lm-eval's --seed seeds its few-shot sampling and the global generators; every mask here comes from model_args
    seed= (pair_seed). The module docstring led with `lm_eval --model timerome`, which lm-eval 0.4.13 refuses."""
    def scores(model_seed, lm_eval_seed):
        res = evaluate_tasks(TimeromeLM(backbone=bb, n_mc=N_MC, seed=model_seed, check_greedy=False), ["fx_mc"],
                             manager=index, seed=lm_eval_seed, log_samples=True)
        return [float(r[0]) for s in res["samples"]["fx_mc"] for r in s["filtered_resps"]]

    assert scores(0, 0) == scores(0, 7) != scores(7, 7)
    assert pair_seed(0, "a", "b") != pair_seed(7, "a", "b")
    first = next(line.strip() for line in M.__doc__.splitlines()[1:] if line.strip())
    assert first.startswith("python -m timerome.integrations.lm_eval_model --model timerome")
    doc = " ".join(M.__doc__.split())
    assert "lm-eval's own --seed" in doc and "--seed 1 --model_args seed=1" in doc
    assert "0.4.13 answers that it knows no model" in doc


# ------------------------------------------------------------------ review 75: what a task's settings say


def test_the_token_budget_under_any_of_lm_evals_names_and_unread_settings_named(bb, monkeypatch):
    """A task's max_new_tokens (or max_tokens, max_completion_tokens: lm-eval's normalize_gen_kwargs) was
    ignored: the answer got lm-eval's default of 256 tokens. num_beams / top_p, which the sampler has no use
    for, were dropped without a word; they are named once per model."""
    lengths = []

    def spy(backbone, prompt, **kw):
        lengths.append(kw["gen_length"])
        return torch.cat([prompt, torch.full((1, kw["gen_length"]), bb.tokenizer.eos_token_id)], 1)

    monkeypatch.setattr(M, "generate", spy)
    lm = TimeromeLM(backbone=bb, n_mc=N_MC)
    with pytest.warns(UserWarning, match=r"num_beams=10, top_p=0.95 is read by nothing here") as seen:
        lm.generate_until([Req("Q ?", {"until": ["\n"], "max_new_tokens": 7}),
                           Req("Q ?", {"max_tokens": 5, "max_completion_tokens": 9}),
                           Req("Q ?", {"max_gen_toks": 3, "max_new_tokens": 4, "num_beams": 10, "top_p": 0.95}),
                           Req("Q ?", {"max_gen_toks": 3, "num_beams": 10, "top_p": 0.95}),
                           Req("Q ?", {"max_gen_toks": 3, "num_beams": 1, "top_p": 1.0})], disable_tqdm=True)
    assert lengths == [7, 5, 3, 3, 3]
    assert sum("read by nothing" in str(w.message) for w in seen) == 1  # once per model
    # a model_args gen_length over a task's budget: taken (documented), and said once at run time
    lm = TimeromeLM(backbone=bb, n_mc=N_MC, gen_length=8, block_length=8)
    with pytest.warns(UserWarning, match="gen_length 8 exceeds a task's budget of 4 tokens") as seen:
        lm.generate_until([Req("Q ?", {"max_gen_toks": 4}), Req("Q ?", {"max_gen_toks": 4})], disable_tqdm=True)
    assert lengths[-2:] == [8, 8] and sum("exceeds" in str(w.message) for w in seen) == 1


def test_sampler_settings_are_checked_when_the_model_is_made_not_at_the_first_generation(bb):
    """remasking=lowconf and block_length without gen_length passed the model's construction and failed at the
    first generate_until request, after any loglikelihood work of the same run."""
    with pytest.raises(TimeromeError, match="unknown remasking 'lowconf'"):
        TimeromeLM(backbone=bb, remasking="lowconf")
    with pytest.raises(TimeromeError, match="block_length=32 without gen_length: each task gives"):
        TimeromeLM(backbone=bb, block_length=32)
    with pytest.raises(TimeromeError, match="gen_length .*100 is not a multiple of block_length .*32"):
        TimeromeLM(backbone=bb, gen_length=100, block_length=32)
    TimeromeLM(backbone=bb, gen_length=64, block_length=32, steps=64)  # a schedule that divides


def test_a_context_cut_to_fit_the_model_is_counted_and_named(bb, monkeypatch):
    """A context longer than the model lost its oldest tokens without a word; now a warning (once) and a count in
    get_model_info, for loglikelihood and generate_until alike."""
    monkeypatch.setattr(M, "generate", lambda backbone, prompt, **kw: torch.cat(
        [prompt, torch.full((1, kw["gen_length"]), bb.tokenizer.eos_token_id)], 1))
    lm = TimeromeLM(backbone=bb, n_mc=N_MC, check_greedy=False)
    long = " ".join(["Where was Isgor Quielson born ?"] * (bb.max_length // 4))
    assert len(bb.encode(long)) > bb.max_length
    with pytest.warns(UserWarning, match="loglikelihood: a context longer than the model's"):
        lm.loglikelihood([Req(long, " Pellmoor"), Req("Where was Isgor Quielson born ?", " Pellmoor")],
                         disable_tqdm=True)
    with pytest.warns(UserWarning, match="generate_until: a context longer"):
        lm.generate_until([Req(long, {"max_gen_toks": 4}), Req(long + " ?", {"max_gen_toks": 4})], disable_tqdm=True)
    assert lm.get_model_info()["timerome_contexts_cut"] == {"loglikelihood": 1, "generate_until": 2}


def test_the_utility_checks_the_generation_schedule_before_loading(tmp_path):
    from timerome.experiments import run_experiment

    for gen, why in (({"block_length": 32}, "block_length=32 without gen_length"),
                     ({"gen_length": 100, "block_length": 32}, "gen_length 100 is not a multiple of block_length 32"),
                     ({"remasking": "lowconf"}, "unknown remasking 'lowconf'")):
        with pytest.raises(TimeromeError, match=f"utility: the generation setting.*{why}"):
            run_experiment("utility", seeds=(0,), out_dir=tmp_path, progress=False,
                           load=lambda path: pytest.fail("loaded"), overrides=dict(tasks=["x"], generation=gen))


def test_the_utility_radar_reads_the_lowest_point_whatever_the_order_given():
    """The radar's utility axis took the last operating point as the strongest: the order of `points` decided it."""
    from timerome.experiments.utility import utility_axis

    s = {"no_edit": {"a": {"mean": 0.8}, "b": {"mean": 0.6}}, "strong": {"a": {"mean": 0.5}, "b": {"mean": 0.5}},
         "weak": {"a": {"mean": 0.8}}}
    for order in (["no_edit", "strong", "weak"], ["no_edit", "weak", "strong"]):
        axis = utility_axis({r: s[r] for r in order}, ["a", "b"])
        assert axis["value"] == 0.5 and axis["comparator"] == pytest.approx(0.7) and "strong (the lowest of 2" in axis["text"]
