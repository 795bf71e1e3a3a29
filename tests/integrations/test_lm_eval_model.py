"""lm-evaluation-harness on a masked diffusion LM, offline: local task files and a local JSON dataset.

lm-eval is a test dependency (pip install -e ".[test]"); where it is missing these tests say so.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: pip install -e '.[test]' (or [eval])")

from timerome import TimeromeError, load_backbone  # noqa: E402
from timerome.data.task import forget_task  # noqa: E402
from timerome.data.tofu import load_split  # noqa: E402
from timerome.engine.encoding import answer_ids  # noqa: E402
from timerome.engine.sampler import generate  # noqa: E402
from timerome.integrations.lm_eval_model import (TimeromeLM, evaluate_tasks, pair_seed, split_request,  # noqa: E402
                                                 task_manager)
from timerome.methods import install  # noqa: E402
from timerome.metrics import answer_logprobs  # noqa: E402

N_MC = 4


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


@pytest.fixture(scope="module")
def docs():
    """Four forget01 questions, each with its answer and two perturbed ones, the answer at index gold."""
    out = []
    for i, r in enumerate(load_split("forget01_perturbed", "embedded")[:4]):
        choices = [r["answer"]] + list(r["perturbed_answer"][:2])
        gold = i % 3
        choices[0], choices[gold] = choices[gold], choices[0]
        out.append({"question": r["question"], "choices": choices, "gold": gold, "answer": r["answer"]})
    return out


def write_tasks(folder: Path, docs) -> Path:
    """A multiple-choice and a generation task reading one local JSON-lines file."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "items.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
              'doc_to_text: "{{question}}"\n')
    (folder / "mc.yaml").write_text("task: tr_mc\n" + common + 'output_type: multiple_choice\n'
                                    'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{gold}}"\n'
                                    'target_delimiter: " "\nmetric_list:\n  - metric: acc\n'
                                    '    aggregation: mean\n    higher_is_better: true\n')
    (folder / "gen.yaml").write_text("task: tr_gen\n" + common + 'output_type: generate_until\n'
                                     'doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["born"]\n'
                                     '  max_gen_toks: 6\nmetric_list:\n  - metric: exact_match\n'
                                     '    aggregation: mean\n    higher_is_better: true\n')
    return folder


@pytest.fixture(scope="module")
def tasks(tmp_path_factory, docs):
    return write_tasks(tmp_path_factory.mktemp("lmeval_tasks"), docs)


@pytest.fixture(scope="module")
def index(tasks):
    """lm-eval's task index over the test tasks, built once for the module (about 10 s)."""
    return task_manager([tasks])


def own_scores(bb, docs, seed=0, edit=None):
    """Our likelihood of every choice, with the masks lm-eval's request of that choice gets."""
    out = []
    ctx = edit.active() if edit is not None else torch.no_grad()
    with ctx:
        for d in docs:
            out.append([float(answer_logprobs(bb, [d["question"]], [c], n_mc=N_MC,
                                              seed=pair_seed(seed, d["question"], " " + c))[0][0])
                        for c in d["choices"]])
    return out


def flat(scores):
    return [v for row in scores for v in row]


def lm_eval_scores(result, name="tr_mc"):
    samples = sorted(result["samples"][name], key=lambda s: s["doc_id"])
    return [[float(r[0]) for r in s["filtered_resps"]] for s in samples]


def test_scores_equal_our_own_likelihood(bb, docs, tasks, index):
    lm = TimeromeLM(backbone=bb, n_mc=N_MC, check_greedy=False)
    res = evaluate_tasks(lm, ["tr_mc"], include_path=[tasks], manager=index, log_samples=True)
    theirs, ours = lm_eval_scores(res), own_scores(bb, docs)
    assert flat(theirs) == pytest.approx(flat(ours), abs=1e-9)
    acc = sum(max(range(3), key=s.__getitem__) == d["gold"] for s, d in zip(ours, docs)) / len(docs)
    assert res["results"]["tr_mc"]["acc,none"] == pytest.approx(acc)
    assert acc >= 0.75  # the embedded model knows these facts: the true answer wins (it is not a coin toss)
    # the request's split: the space goes with the continuation, the context's tokens are the question's
    q, a = docs[0]["question"], docs[0]["choices"][0]
    ctx, cont = split_request(bb, q + " ", a)
    assert ctx == bb.encode(q) and cont == answer_ids(bb, a)


def test_a_benchmark_length_prompt_fits_the_context(bb, docs, tmp_path):
    # standard multiple-choice prompts carry a few hundred tokens of few-shot context: the embedded
    # model's 512-token context takes them (it stopped at the first such request with 64)
    preamble = " ".join(r["question"] + " " + r["answer"] for r in load_split("retain_perturbed", "embedded")[:20])
    long_docs = [dict(d, question=preamble + " " + d["question"]) for d in docs]
    assert 300 < len(bb.encode(long_docs[0]["question"])) < bb.max_length
    folder = write_tasks(tmp_path / "long", long_docs)
    res = evaluate_tasks(TimeromeLM(backbone=bb, n_mc=N_MC, check_greedy=False), ["tr_mc"], include_path=[folder],
                         log_samples=True)
    assert len(lm_eval_scores(res)) == len(docs) and 0 <= res["results"]["tr_mc"]["acc,none"] <= 1


def test_an_installed_edit_is_active_during_evaluation(bb, docs, tasks, tmp_path, index):
    task = forget_task("embedded", "forget01")
    edit = install("timerome", bb, task, {}, seed=0)
    try:
        path = edit.memory.save(tmp_path / "forget.safetensors")
        with_file = evaluate_tasks(TimeromeLM(backbone=bb, edit=str(path), n_mc=N_MC, check_greedy=False), ["tr_mc"],
                                   include_path=[tasks], manager=index, log_samples=True)
        expected = own_scores(bb, docs, edit=edit)
    finally:
        edit.undo()
    before = own_scores(bb, docs)
    assert flat(lm_eval_scores(with_file)) == pytest.approx(flat(expected), rel=1e-6, abs=1e-6)
    # forgetting: every true answer is less likely under the edit
    for d, b, e in zip(docs, before, expected):
        assert e[d["gold"]] < b[d["gold"]] - 1.0
    # the same edit installed by name through model_args, and alpha overriding the saved operating point
    by_name = evaluate_tasks(TimeromeLM(backbone=bb, method="timerome", n_mc=N_MC, check_greedy=False), ["tr_mc"],
                             include_path=[tasks], manager=index, log_samples=True)
    assert flat(lm_eval_scores(by_name)) == pytest.approx(flat(expected), rel=1e-6, abs=1e-6)
    weaker = TimeromeLM(backbone=bb, edit=str(path), alpha=0.0, n_mc=N_MC, check_greedy=False)
    assert flat(lm_eval_scores(evaluate_tasks(weaker, ["tr_mc"], include_path=[tasks], manager=index,
                                              log_samples=True))) == \
        pytest.approx(flat(before), abs=1e-6)  # alpha 0: no change at all


def test_a_saved_codebook_memory_is_active_too(bb, docs, tasks, tmp_path, index):
    task = forget_task("embedded", "forget01")
    edit = install("codebook", bb, task, {"coordinate": [0, "resid"]}, seed=0)
    path = edit.memory.save(tmp_path / "cb.safetensors")
    expected = own_scores(bb, docs, edit=edit)
    lm = TimeromeLM(backbone=bb, edit=str(path), n_mc=N_MC, check_greedy=False)
    assert lm.edit_info["q"] is None and lm.edit_info["alpha"] == 8.0
    got = evaluate_tasks(lm, ["tr_mc"], include_path=[tasks], manager=index, log_samples=True)
    assert flat(lm_eval_scores(got)) == pytest.approx(flat(expected), rel=1e-6, abs=1e-6)
    for d, b, e in zip(docs, own_scores(bb, docs), expected):  # the forget answers do fall
        assert e[d["gold"]] < b[d["gold"]] - 1.0
    with pytest.raises(TimeromeError, match="only alpha and inner and margin apply"):
        TimeromeLM(backbone=bb, edit=str(path), q=4)


def test_generate_until_is_our_sampler_cut_at_the_stop_sequence(bb, docs, tasks, index):
    res = evaluate_tasks(TimeromeLM(backbone=bb, n_mc=N_MC), ["tr_gen"], include_path=[tasks], manager=index,
                         log_samples=True)
    got = [s["filtered_resps"][0] for s in sorted(res["samples"]["tr_gen"], key=lambda s: s["doc_id"])]
    cut = 0
    for d, text in zip(docs, got):
        prompt = torch.tensor([bb.encode(d["question"])])
        g = torch.Generator().manual_seed(pair_seed(0, d["question"], json.dumps({"max_gen_toks": 6})))
        x = generate(bb, prompt, steps=6, gen_length=6, block_length=6, generator=g)
        out = x[0, prompt.shape[1]:].tolist()  # the answer ends at its first special token (end-of-text)
        full = bb.decode(out[:next((j for j, t in enumerate(out) if t in bb.tokenizer.all_special_ids), len(out))])
        cut += "born" in full
        assert text == (full[:full.index("born")] if "born" in full else full) and "born" not in text
    assert cut >= 2  # the "where was X born" answers did write the stop word: the cut was exercised


def test_is_greedy_is_the_samplers_own_fill(bb, docs):
    lm = TimeromeLM(backbone=bb, n_mc=N_MC)
    q = docs[0]["question"]
    prompt = torch.tensor([bb.encode(q)])
    x = generate(bb, prompt, steps=5, gen_length=5, block_length=5)
    own = bb.tokenizer.decode(x[0, prompt.shape[1]:].tolist())

    class Req:
        def __init__(self, *args):
            self.args = args

    (lp, greedy), (lp2, greedy2) = lm.loglikelihood([Req(q, " " + own), Req(q, " " + own + " Tessaro")],
                                                    disable_tqdm=True)
    assert greedy and not greedy2 and lp > lp2


class Req:
    def __init__(self, *args):
        self.args = args


def test_long_requests_the_context_cannot_hold_are_cut_as_lm_evals_models_cut_them(bb):
    """Stop 61's audit: a rolling document of 512 tokens or more stopped the run (a window was
    max_length + 1 tokens, read in one forward); a context + continuation over the context stopped
    it too (lm-eval's HF models cut the oldest context tokens); rolling conditioned its first window
    on BOS, a token the model never starts with, where loglikelihood("", text) conditions on the
    sequence start."""
    from timerome.engine.likelihood import log_likelihood_batch

    lm = TimeromeLM(backbone=bb, n_mc=2, mc_batch=2, check_greedy=False)
    long = " ".join(r["question"] + " " + r["answer"] for r in load_split("retain90", "embedded")[:60])
    ids = bb.encode(long)
    assert len(ids) > bb.max_length
    (total,) = lm.loglikelihood_rolling([Req(long)], disable_tqdm=True)
    assert total < 0 and total == total
    short = "Isgor Quielson was born in Pellmoor ."
    (rolled,) = lm.loglikelihood_rolling([Req(short)], disable_tqdm=True)
    g = torch.Generator().manual_seed(pair_seed(0, json.dumps(bb.prompt_start), json.dumps(bb.encode(short))))
    assert rolled == pytest.approx(float(log_likelihood_batch(bb, [bb.prompt_start], [bb.encode(short)], n_mc=2,
                                                              batch_size=2, generator=g)[0]))
    context = bb.decode(ids[: bb.max_length + 10])  # more than the model holds before the continuation
    (lp, _), = lm.loglikelihood([Req(context, " " + short)], disable_tqdm=True)
    ctx, cont = split_request(bb, context, " " + short)
    kept = ctx[len(ctx) - (bb.max_length - len(cont)):]  # the most recent context tokens that fit
    g = torch.Generator().manual_seed(pair_seed(0, context, " " + short))
    assert lp == pytest.approx(float(log_likelihood_batch(bb, [kept], [cont], n_mc=2, batch_size=2, generator=g)[0]))
    with pytest.raises(TimeromeError, match="does not fit the model's context"):
        lm.loglikelihood([Req("Q", " " + long)], disable_tqdm=True)


def test_an_empty_context_is_the_models_own_start_on_an_autoregressive_model_and_diffullama(tmp_path):
    """Review of stop 61's change: an AR model's first rolling window read its first token from its own
    position (no BOS), and an empty context crashed in the sampler; DiffuLLaMA's <s> is kept in front."""
    from timerome.backbones import golden
    from timerome.backbones.tiny import make_tiny_checkpoint
    from timerome.engine.likelihood import exact_log_likelihood
    from conftest import FIXTURES

    ar = load_backbone(make_tiny_checkpoint("llama", tmp_path / "ar"))
    bos = ar.tokenizer.bos_token_id if ar.tokenizer.bos_token_id is not None else ar.tokenizer.eos_token_id
    lm = TimeromeLM(backbone=ar, n_mc=2)
    text = "hello world the cat"
    (rolled,) = lm.loglikelihood_rolling([Req(text)], disable_tqdm=True)
    assert rolled == pytest.approx(float(exact_log_likelihood(ar, [bos], ar.encode(text))), abs=1e-5)
    again = lm.loglikelihood_rolling([Req(text), Req("the cat"), Req(text)], disable_tqdm=True)  # in order, once each
    assert again[0] == again[2] == rolled and again[1] != rolled
    ((lp, _),) = lm.loglikelihood([Req("", " hello world")], disable_tqdm=True)  # crashed: a prompt of no token
    assert lp == pytest.approx(float(exact_log_likelihood(ar, [bos], split_request(ar, "", " hello world")[1])),
                               abs=1e-5)
    (said,) = lm.generate_until([Req("", {"until": ["\n"], "max_gen_toks": 3})], disable_tqdm=True)
    assert isinstance(said, str)
    with pytest.raises(TimeromeError, match="autoregressive model writes each token"):
        generate(ar, torch.zeros(1, 0, dtype=torch.long), steps=3, gen_length=3, block_length=3)
    dl = load_backbone(golden.paths(FIXTURES, "diffullama")[0])
    assert dl.prompt_start == [1] and split_request(dl, "", " Paris")[0] == [1]
    lm = TimeromeLM(backbone=dl, n_mc=2, check_greedy=False)
    context = " ".join(["Where was Harry Potter born ?"] * 230)
    ctx, cont = split_request(dl, context, " London")
    assert len(ctx) + len(cont) > dl.max_length
    g = torch.Generator().manual_seed(pair_seed(0, context, " London"))
    kept = [1] + ctx[len(ctx) - (dl.max_length - len(cont) - 1):]  # the start, then the most recent tokens
    from timerome.engine.likelihood import log_likelihood_batch

    ((lp, _),) = lm.loglikelihood([Req(context, " London")], disable_tqdm=True)
    assert lp == pytest.approx(float(log_likelihood_batch(dl, [kept], [cont], n_mc=2, batch_size=16, generator=g)[0]))

    import timerome.integrations.lm_eval_model as M

    seen = []

    def spy(bb, prompt, **kw):  # what generate_until feeds the sampler
        seen.append(prompt[0].tolist())
        return torch.cat([prompt, torch.full((1, kw["gen_length"]), dl.tokenizer.eos_token_id)], 1)

    real, M.generate = M.generate, spy
    try:
        lm.generate_until([Req(context, {"until": ["\n"], "max_gen_toks": 4})], disable_tqdm=True)
    finally:
        M.generate = real
    (fed,) = seen  # the start kept in front of the most recent tokens (stop 60 left it out when it cut)
    assert fed[0] == 1 and len(fed) == dl.max_length - 4 and fed[1:] == dl.encode_prompt(context)[-(len(fed) - 1):]


def test_an_empty_context_is_greedy_when_the_sampler_fills_the_continuation(bb):
    """A mask standing in for the empty context took one of the n steps, so a continuation of more
    than one token was never greedy (its last position was still a mask)."""
    x = generate(bb, torch.zeros(1, 0, dtype=torch.long), steps=4, gen_length=4, block_length=4)
    own = bb.tokenizer.decode(x[0].tolist())
    lm = TimeromeLM(backbone=bb, n_mc=N_MC)
    ((_, greedy),) = lm.loglikelihood([Req("", own)], disable_tqdm=True)
    cont = split_request(bb, "", own)[1]
    assert len(cont) > 1 and (greedy == (cont == x[0, :len(cont)].tolist())) and greedy


def test_bad_model_args_are_one_clear_error(bb, tmp_path):
    with pytest.raises(TimeromeError, match="model_args alphaa: no such argument of the model"):
        TimeromeLM(backbone=bb, alphaa=1.0)
    with pytest.raises(TimeromeError, match="model_args alpha: .* apply only beside edit=MEMORY_FILE or method=NAME"):
        TimeromeLM(backbone=bb, alpha=2.0)  # docs/scale.md's alpha, without an edit (review 71: "unknown")
    with pytest.raises(TimeromeError, match="no option bogus"):
        TimeromeLM(backbone=bb, method="timerome", bogus=1)
    with pytest.raises(TimeromeError, match="give one of"):
        TimeromeLM(backbone=bb, method="timerome", edit="x.safetensors")
    if not torch.cuda.is_available():  # lm-eval's --device defaults to cuda:0
        with pytest.raises(TimeromeError, match="pass --device cpu"):
            TimeromeLM(device="cuda:0")
    with pytest.raises(TimeromeError, match="could not run tasks"):
        evaluate_tasks(TimeromeLM(backbone=bb), ["no_such_task_anywhere"], include_path=[tmp_path])


def test_task_data_out_of_reach_is_one_line_with_what_to_do(bb, monkeypatch, capsys):
    """Without internet, lm-eval's download of a task's data (arc_easy: allenai/ai2_arc) ended our entry
    point in a traceback from `datasets`; it is one line saying what lm-eval needs offline."""
    import lm_eval
    import lm_eval.__main__

    import timerome.integrations.lm_eval_model as M

    def offline(*_a, **_k):
        raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(lm_eval, "simple_evaluate", offline)
    with pytest.raises(TimeromeError, match="arc_easy: Couldn't reach 'allenai/ai2_arc'.*HF_DATASETS_OFFLINE"):
        evaluate_tasks(TimeromeLM(backbone=bb), ["arc_easy"], manager=object())
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", offline)
    with pytest.raises(SystemExit) as stop:
        M.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("error: lm-eval could not fetch its task")


@pytest.mark.slow
def test_lm_eval_command_line_runs_the_registered_model(docs, tmp_path):
    # lm-eval's own CLI with our model registered (lm-eval 0.4.13 reads no entry points)
    folder = write_tasks(tmp_path / "tasks", docs)
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "timerome.integrations.lm_eval_model", "--model", "timerome", "--model_args",
                          f"n_mc={N_MC},check_greedy=False", "--device", "cpu", "--tasks", "tr_mc",
                          "--include_path", str(folder), "--output_path", str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    saved = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert saved["results"]["tr_mc"]["acc,none"] >= 0.75
    assert saved["config"]["timerome_edit"] is None and saved["config"]["n_mc"] == N_MC


def test_utility_experiment_tabulates_operating_points_next_to_no_edit(bb, tasks, tmp_path, index):
    from timerome.experiments import run_experiment

    over = dict(tasks=["tr_mc"], include_path=str(tasks), n_mc=N_MC, points=({"alpha": 0.0, "q": 0}, {}))
    res = run_experiment("utility", seeds=(0, 1), out_dir=tmp_path, overrides=over, progress=False, backbone=bb)
    s = res["summary"]
    assert list(s) == ["no_edit", "timerome (alpha=0, q=0)", "timerome"]
    # no_edit's score is lm-eval's own on the unedited model, seed by seed
    for seed in (0, 1):
        direct = evaluate_tasks(TimeromeLM(backbone=bb, n_mc=N_MC, seed=seed, check_greedy=False), ["tr_mc"],
                                include_path=[tasks], manager=index)
        assert s["no_edit"]["tr_mc"]["values"][seed] == direct["results"]["tr_mc"]["acc,none"]
    # alpha 0 changes nothing; the default edit forgets these very facts, so its accuracy falls
    assert s["timerome (alpha=0, q=0)"]["tr_mc"]["values"] == s["no_edit"]["tr_mc"]["values"]
    assert s["timerome"]["tr_mc"]["mean"] < s["no_edit"]["tr_mc"]["mean"]
    assert s["timerome"]["install_seconds"]["mean"] > 0 and s["timerome"]["wall_seconds"]["mean"] > 0
    md = (tmp_path / "utility.md").read_text()
    assert "| tr_mc (acc) |" in md and "tasks within noise" in md and (tmp_path / "utility.png").exists()
    assert res["within_noise"]["timerome (alpha=0, q=0)"] == 1
    saved = json.loads((tmp_path / "utility.json").read_text())
    assert saved["radar"]["utility"]["comparator"] == pytest.approx(s["no_edit"]["tr_mc"]["mean"])


def test_utility_says_generation_settings_no_request_read(bb, tasks, tmp_path):
    """`generation` configures generate_until only; with log-likelihood tasks alone it was read by nothing, without
    a word (which requests a task makes, lm-eval alone knows: said after the run, in the report)."""
    from timerome.experiments import run_experiment

    over = dict(tasks=["tr_mc"], include_path=str(tasks), n_mc=2, points=(), generation={"gen_length": 8})
    with pytest.warns(UserWarning, match=r"the generation settings \(gen_length\) were read by no request: tr_mc asks"):
        run_experiment("utility", seeds=(0,), out_dir=tmp_path / "mc", overrides=over, progress=False, backbone=bb)
    assert "Note: the generation settings (gen_length)" in (tmp_path / "mc" / "utility.md").read_text()
    over["tasks"] = ["tr_mc", "tr_gen"]  # a generative task reads them: nothing said
    run_experiment("utility", seeds=(0,), out_dir=tmp_path / "gen", overrides=over, progress=False, backbone=bb)
    assert "Note: the generation settings" not in (tmp_path / "gen" / "utility.md").read_text()
    # every request reads the likelihood's batch: nothing said; an unknown name is refused before any work (it was
    # taken, and read by nothing where an edit was installed)
    over = dict(over, tasks=["tr_mc"], generation={"mc_batch": 4})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_experiment("utility", seeds=(0,), out_dir=tmp_path / "batch", overrides=over, progress=False, backbone=bb)
    for gen, says in (({"bogus": 1}, "the generation setting has no 'bogus'; it takes steps, gen_length"),
                      ({"n_mc": 2}, "has no 'n_mc'")):
        with pytest.raises(TimeromeError, match=says):
            run_experiment("utility", seeds=(0,), out_dir=tmp_path / "bad", overrides=dict(over, generation=gen),
                           progress=False, load=lambda path: pytest.fail("loaded"))


def test_a_setting_given_in_model_args_and_as_lm_evals_own_flag():
    """`--model_args device=cpu --device cuda` (or batch_size= beside --batch_size) raised lm-eval's "got multiple
    values for keyword argument" through our entry point; two values are refused in one line, one value twice is
    one setting."""
    from timerome.integrations.lm_eval_model import TimeromeLM

    with pytest.raises(TimeromeError, match="device given twice: --model_args device=cpu and --device cuda: give each"):
        TimeromeLM.create_from_arg_string("device=cpu", {"device": "cuda", "batch_size": None})
    with pytest.raises(TimeromeError, match="batch_size given twice"):
        TimeromeLM.create_from_arg_string("batch_size=2,n_mc=2", {"batch_size": 4})
    lm = TimeromeLM.create_from_arg_string("device=cpu,n_mc=2", {"device": "cpu", "batch_size": None})
    assert lm.n_mc == 2 and lm.backbone.device.type == "cpu"
    # lm-eval 0.4.13's command line hands --model_args over as a dict (create_from_arg_obj): the same rule
    with pytest.raises(TimeromeError, match="device given twice: --model_args device=cpu and --device cuda:0"):
        TimeromeLM.create_from_arg_obj({"device": "cpu", "n_mc": 2}, {"device": "cuda:0", "batch_size": 1})
    assert TimeromeLM.create_from_arg_obj({"device": "cpu", "n_mc": 3}, {"device": "cpu"}).n_mc == 3


@pytest.mark.parametrize("args, match", [
    ("pretrained=,n_mc=2", "the model is empty"),              # an empty pretrained= evaluated the embedded model
    ("n_mc=2,n_mc=4", "--model_args gives n_mc twice"),        # the parser kept the last value without a word
    ("forget=forget05", "the forget set of method=, which is not given"),  # read by nothing without method=
    ("steps=8,threshold=0.9", "steps is read by nothing beside threshold"),  # as `timerome generate` refuses it
])
def test_model_args_read_wrong_or_by_nothing_are_refused(args, match):
    """Stop 79 (review 87): each of these was accepted, the model evaluated as if it were not given."""
    from timerome.integrations.lm_eval_model import TimeromeLM

    with pytest.raises(TimeromeError, match=match):
        TimeromeLM.create_from_arg_string(args, {"device": "cpu"})
