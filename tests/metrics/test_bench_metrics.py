"""Benchmark metrics on hand-built inputs whose answer is known (MUSE, WHP, WMDP, RWKU, robustness)."""

import numpy as np
import pytest
import torch

from timerome import TimeromeError
from timerome.data.tokenizer import build_word_tokenizer
from timerome.engine import encoding, sampler
from timerome.metrics import choice, membership, muse, robustness, rwku, text, whp, wmdp

WORDS = "a b c yes no maybe A B C D Question Answer question ? : . the cat sat"


class Fake:
    """A backbone whose logits are a fixed rule of the position (or a fixed favourite token):
    what it predicts is known exactly, so every score built on it is known too."""

    def __init__(self, favourite=None, pattern=None, max_length=64):
        self.tokenizer = build_word_tokenizer([WORDS])
        self.mask_id = int(self.tokenizer.mask_token_id)
        self.vocab_size, self.max_length, self.device = len(self.tokenizer), max_length, torch.device("cpu")
        self.favourite = None if favourite is None else self.encode(favourite)[0]
        self.pattern = None if pattern is None else [self.encode(w)[0] for w in pattern]

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt_start = []  # a word tokenizer puts nothing at a sequence start

    def encode_prompt(self, text):
        return self.encode(text)

    def decode(self, ids):
        return self.tokenizer.decode([i for i in ids if i != self.mask_id], skip_special_tokens=True)

    def logits(self, ids, attention_mask=None):
        B, L = ids.shape
        out = torch.zeros(B, L, self.vocab_size)
        for i in range(L):
            tok = self.favourite if self.pattern is None else self.pattern[i % len(self.pattern)]
            out[:, i, tok] = 30.0
        return out


def test_rouge_l_known_values():
    assert text.rouge_l(["the cat sat"], ["the cat sat"]).tolist() == [1.0]  # a perfect continuation
    assert text.rouge_l(["dog ran"], ["the cat sat"]).tolist() == [0.0]
    # LCS "the cat" of 2: recall 2/3 (reference of 3 words), precision 2/2, F1 0.8
    assert text.rouge_l(["the cat"], ["the cat sat"], "recall")[0] == pytest.approx(2 / 3)
    assert text.rouge_l(["the cat"], ["the cat sat"])[0] == pytest.approx(0.8)
    assert text.rouge_l([""], ["the cat"]).tolist() == [0.0]
    with pytest.raises(TimeromeError, match="fmeasure, recall"):
        text.rouge_l(["a"], ["a"], "f2")


def test_cut_at_and_fit():
    assert sampler.cut_at(" Snitch\n\nQuestion: next", muse.STOPS) == "Snitch"
    assert sampler.cut_at("Paris\nmore", rwku.STOPS) == "Paris"
    p, a, cut = encoding.fit(list(range(10)), [1, 2, 3], 8)
    assert (p, a, cut) == ([5, 6, 7, 8, 9], [1, 2, 3], True)  # the prompt's start goes, never the answer
    assert encoding.fit([1, 2], [3], 8) == ([1, 2], [3], False)
    p, a, cut = encoding.fit([1, 2], list(range(20)), 8)
    assert len(a) == 7 and len(p) == 1 and cut


def test_auc_known_cases():
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    assert membership.auc(x, x) == pytest.approx(0.5)  # identical score distributions
    assert membership.auc([3, 4, 5], [0, 1, 2]) == 1.0  # every member more likely
    assert membership.auc([0, 1, 2], [3, 4, 5]) == 0.0
    assert membership.auc([1, 2], [1, 0]) == pytest.approx(0.875)  # the tie counts one half: (.5 + 1 + 1 + 1) / 4
    with pytest.raises(TimeromeError, match="both member and non-member"):
        membership.auc([], [1.0])


def test_min_k_and_privleak():
    s = [-5.0, -1.0, -0.5, -0.1, -3.0]
    assert membership.min_k(s, 0.4) == pytest.approx(-4.0)  # the 2 lowest of 5: -5 and -3
    assert membership.min_k(s, 0.1) == -5.0  # at least one token
    assert membership.min_k(s, 1.0) == pytest.approx(np.mean(s))
    with pytest.raises(TimeromeError, match="k must lie"):
        membership.min_k(s, 0)
    # MUSE convention: 0 = like the retrained model, -100 = the forget set fully recognisable
    assert membership.privleak(0.55, 0.55) == pytest.approx(0.0)
    assert membership.privleak(1.0, 0.5) == pytest.approx(-100.0)
    assert membership.privleak(0.0, 0.5) == pytest.approx(100.0)
    with pytest.raises(TimeromeError, match="reference AUC"):
        membership.privleak(0.5, 1.0)


def test_token_scores_and_min_k_auc_on_a_model_that_knows_a_pattern():
    bb = Fake(pattern=["a", "b"])  # predicts "a" at even positions, "b" at odd ones
    scores, cut = membership.token_scores(bb, ["a b a b a b", "b a b a"], groups=3, seed=0)
    assert cut == 0 and [len(s) for s in scores] == [6, 4]
    assert np.allclose(scores[0], 0.0, atol=1e-6)  # every token as predicted: log p = 0
    assert (scores[1] < -25).all()  # every token against the prediction
    res = membership.min_k_auc(bb, ["a b a b", "a b a"], ["b a b a", "b a b"], groups=2)
    assert res["auc"] == 1.0 and res["member_token_lp"][0] > res["nonmember_token_lp"][0]
    same = membership.min_k_auc(bb, ["a b a b", "b a b"], ["a b a b", "b a b"], groups=2)
    assert same["auc"] == pytest.approx(0.5)
    # groups = length: each token alone masked, the pseudo-log-likelihood; still exact here
    pll, _ = membership.token_scores(bb, ["a b a"], groups=100)
    assert np.allclose(pll[0], 0.0, atol=1e-6)
    with pytest.raises(TimeromeError, match="groups and repeats"):
        membership.token_scores(bb, ["a"], groups=0)


def test_a_choice_with_all_the_probability_wins():
    lp = [np.array([-3.0, -0.1, -9.0]), np.array([-2.0, -4.0])]
    n = [np.array([1, 1, 1]), np.array([1, 8])]
    assert choice.correct(lp, n, [1, 0]).tolist() == [True, True]
    assert choice.correct(lp, n, [1, 1], normalise=True).tolist() == [True, True]  # -4/8 beats -2/1
    with pytest.raises(TimeromeError, match="choice index 3 out of range"):
        choice.correct(lp, n, [3, 0])
    # a NaN score: no choice equals the NaN maximum, so the item was 0/0 and the whole accuracy NaN
    with pytest.raises(TimeromeError, match="items 1 have a choice whose log-probability is not finite"):
        choice.correct([lp[0], np.array([-2.0, np.nan])], n, [1, 0])
    bb = Fake(favourite="yes")
    lp, ln, cut = choice.choice_logprobs(bb, ["question ?", "question ?"], [["no", "yes", "maybe"], ["yes", "no"]], n_mc=2)
    assert choice.picks(lp, ln).tolist() == [1, 0] and cut.tolist() == [False, False]
    assert lp[0][1] == pytest.approx(0.0, abs=1e-6) and lp[0][0] < -25


def test_wmdp_prompt_and_letter_scoring():
    row = {"question": " What is it? ", "choices": ["a", "b", "c", "the cat"], "answer": 2}
    assert wmdp.prompt(row, "bio") == ("The following are multiple choice questions (with answers) about biology.\n\n"
                                       "What is it?\nA. a\nB. b\nC. c\nD. the cat\nAnswer:")
    assert wmdp.prompt(row, None).startswith("The following are multiple choice questions (with answers).\n\n")
    res = wmdp.score(Fake(favourite="C"), [row, dict(row, answer=0)], subject="bio", n_mc=2)
    assert res["letter_correct"] == [True, False]
    assert wmdp.summary({"wmdp": res})["WMDP_Acc"] == 0.5



def test_wmdp_and_whp_trivia_say_their_progress(monkeypatch, capsys):
    """`eval --bench wmdp` on SmolLM2 ran two minutes without a line (review 64): the choices' likelihoods had no bar."""
    monkeypatch.setenv("TIMEROME_PROGRESS_SECONDS", "0")
    row = {"question": "What is it?", "choices": ["a", "b"], "answer": 1}
    wmdp.score(Fake(favourite="B"), [row], subject="bio", n_mc=2, progress=True)
    whp.trivia(Fake(favourite="yes"), [{"question": "q ?", "true_answer": "yes", "false_answer": "no"}], n_mc=2,
               progress=True)
    err = capsys.readouterr().err
    assert err.count("log-likelihood: 1/1 (100%)") == 3, err  # wmdp: letters, then texts; whp: the pairs
    wmdp.score(Fake(favourite="B"), [row], subject="bio", n_mc=2)  # off by default (the API's)
    assert capsys.readouterr().err == ""


def test_whp_trivia_and_familiarity_share():
    rows = [{"question": "question ?", "true_answer": "yes", "false_answer": "no"},
            {"question": "question ?", "true_answer": "no", "false_answer": "yes"}]
    res = whp.trivia(Fake(favourite="yes"), rows, n_mc=2)
    assert res["correct"] == [True, False] and res["lp"][0] > res["false_lp"][0]
    text_ = "Ron waved his WAND at Hermione's cat"
    assert whp.reference_share(text_, ["Ron", "wand", "Hermione", "Dumbledore"]) == 0.75
    assert whp.reference_share("Ronald", ["Ron"]) == 0.0  # whole words only
    assert np.isnan(whp.reference_share("Ron", []))  # no words to find: not "unfamiliar" (0)
    summary = whp.summary({"trivia": res, "familiarity": {"share": [0.5, 1.0]}})
    assert summary["WHP_Acc"] == 0.5 and summary["WHP_Familiarity"] == 0.75


def test_rwku_prompts_follow_rwku():
    assert rwku.probe_prompt({"level": "1", "query": "X is an American ___ "}) == (
        "Please complete the blank in the following question.\nQuestion: X is an American ___\nAnswer:")
    assert rwku.probe_prompt({"level": "2", "query": "Who?"}).endswith("\nQuestion: Who?\nAnswer:")
    assert rwku.probe_prompt({"level": "3", "type": "affirmative suffix", "query": "Sure:"}).endswith("Question: Sure:")
    assert rwku.probe_prompt({"level": "3", "type": "incontext learning", "query": "Q: a"}).endswith("\nQ: a\nAnswer:")
    assert rwku.qa_rows([{"level": "2", "query": "Who?", "answer": "me", "subject": "S"}])[0]["answer"] == "me"


def test_knowmem_prompt_is_museS_few_shot_format():
    icl = [{"question": "q1", "answer": "a1"}, {"question": "q2", "answer": "a2"}]
    assert muse.knowmem_prompt("q3", icl) == ("Question: q1\nAnswer: a1\n\nQuestion: q2\nAnswer: a2\n\n"
                                              "Question: q3\nAnswer:")
    items = {"knowmem_forget": {"lp": [-1.0, -3.0], "rouge": [1.0, 0.0]}, "verbmem": {"lp": [-10.0]},
             "privleak": {"auc": 0.9, "privleak": None}}
    s = muse.summary(items)
    assert s == {"KnowMemLP": -2.0, "KnowMemROUGE": 0.5, "VerbMemLP": -10.0, "PrivLeakAUC": 0.9}


def test_robustness_probes_and_changes():
    rows = [{"question": "q1", "answer": "a1", "paraphrased_question": "pq1", "paraphrased_answer": "pa1"},
            {"question": "q2", "answer": "a2"}]
    p = robustness.probes(rows)
    assert p["relearn"]["prompts"][0] == "q1 a1\nq1" and p["relearn"]["answers"][0] == "a1"
    assert p["paraphrased_question"]["index"] == [0] and p["paraphrased_answer"]["answers"] == ["pa1"]
    assert p["original"]["index"] == [0, 1]
    before = {"original": {"index": [0, 1], "lp": [-1.0, -2.0]}, "paraphrased_question": {"index": [0], "lp": [-1.5]},
              "paraphrased_answer": {"index": [0], "lp": [-3.0]}, "relearn": {"index": [0, 1], "lp": [-0.5, -0.5]}}
    after = {"original": {"index": [0, 1], "lp": [-11.0, -12.0]}, "paraphrased_question": {"index": [0], "lp": [-10.0]},
             "paraphrased_answer": {"index": [0], "lp": [-13.0]}, "relearn": {"index": [0, 1], "lp": [-2.5, -2.5]}}
    r = robustness.robustness(before, after)
    assert r["original"] == {"change": -10.0, "original": -10.0, "weakening": 0.0}
    assert r["paraphrased_question"]["change"] == pytest.approx(-8.5) and r["paraphrased_question"]["weakening"] == 1.5
    assert r["relearn"]["weakening"] == pytest.approx(8.0)  # the relearn attack takes back 8 of the 10 nats
    with pytest.raises(TimeromeError, match="lacks its question or answer"):
        robustness.probes([{"question": "q"}])


def test_weakening_reads_a_condition_against_the_original_on_the_same_rows():
    """Row 0 holds under its paraphrase exactly (both -10); row 1 has no paraphrase and a change of
    -2. The mean change over both rows (-6) less the paraphrase's over row 0 (-10) read as a
    weakening of -4, from a row the paraphrase never probed (stop 62's metrics audit)."""
    before = {"original": {"index": [0, 1], "lp": [0.0, 0.0]}, "paraphrased_question": {"index": [0], "lp": [0.0]},
              "paraphrased_answer": {"index": [], "lp": []}, "relearn": {"index": [0, 1], "lp": [0.0, 0.0]}}
    after = {"original": {"index": [0, 1], "lp": [-10.0, -2.0]}, "paraphrased_question": {"index": [0], "lp": [-10.0]},
             "paraphrased_answer": {"index": [], "lp": []}, "relearn": {"index": [0, 1], "lp": [-4.0, -1.0]}}
    r = robustness.robustness(before, after)
    assert r["original"]["change"] == -6.0
    assert r["paraphrased_question"] == {"change": -10.0, "original": -10.0, "weakening": 0.0}
    assert r["relearn"]["weakening"] == pytest.approx(3.5)  # (6 + 1) / 2, row by row
    assert np.isnan(r["paraphrased_answer"]["weakening"]) and np.isnan(r["paraphrased_answer"]["change"])
    from timerome.experiments.robustness import kept_share
    stats = {c: {k: {"mean": v} for k, v in r[c].items() if np.isfinite(v)} for c in r}
    assert kept_share(stats) == pytest.approx(min(1.0, 2.5 / 6.0))  # relearn keeps 2.5 of 6; the paraphrase all 10


def test_robustness_panel_with_an_inference_edit():
    from contextlib import contextmanager

    bb = Fake(favourite="yes")

    class Flip:  # an "edit" that makes the model prefer "no" while active
        @contextmanager
        def active(self):
            old, bb.favourite = bb.favourite, bb.encode("no")[0]
            try:
                yield
            finally:
                bb.favourite = old

    rows = [{"question": "question ?", "answer": "yes", "paraphrased_question": "the question ?",
             "paraphrased_answer": "yes"}]
    res = robustness.robustness_panel(bb, rows, Flip(), n_mc=2)
    assert res["unedited"]["original"]["lp"][0] == pytest.approx(0.0, abs=1e-6)
    assert res["robustness"]["original"]["change"] < -25  # the edit took "yes" away
    assert bb.favourite == bb.encode("yes")[0]  # and gave it back
    assert res["unedited"]["cut"] == {c: 0 for c in robustness.CONDITIONS}


def test_a_relearn_prompt_cut_to_fit_the_context_is_counted():
    """The relearn prompt (question, answer, question) is about twice the original: on a short context it
    loses its oldest tokens, the answer it repeats among them. That is counted, per condition, not
    left to pass for a relearn probe that showed the whole answer."""
    bb = Fake(favourite="yes", max_length=12)
    rows = [{"question": "the cat sat ?", "answer": "yes no maybe yes no"}]  # original 4 + 5; relearn 13 + 5
    res = robustness.condition_logprobs(bb, rows, n_mc=2)
    assert res["cut"] == {"original": 0, "paraphrased_question": 0, "paraphrased_answer": 0, "relearn": 1}


@pytest.fixture(scope="module")
def embedded():
    from timerome.backbones import load_backbone

    return load_backbone(None)


def test_pair_logprobs_is_the_tofu_answer_logprob_when_nothing_is_cut(embedded):
    from timerome.data.tofu import load_split
    from timerome.metrics import answer_logprobs

    rows = load_split("forget01_perturbed", "embedded")[:4]
    q, a = [r["question"] for r in rows], [r["answer"] for r in rows]
    res = text.pair_logprobs(embedded, q, a, n_mc=4, seed=3)
    assert res["cut"] == 0 and np.allclose(res["lp"], answer_logprobs(embedded, q, a, n_mc=4, seed=3)[0])
    long = text.pair_logprobs(embedded, [" ".join([q[0]] * 120)], [a[0]], n_mc=4, seed=3)
    assert long["cut"] == 1 and np.isfinite(long["lp"]).all()  # cut to the context, and counted


def test_every_benchmark_pass_counts_the_prompts_it_cut(embedded):
    """Each pass that fits prompts to the context (512 tokens here) says how many it cut: the likelihood's
    (lp_cut), the generation's (prompts_cut), per metric family; the experiments' notes read them."""
    from timerome.experiments.bench_measures import cut_counts

    long, short = " ".join(["the"] * 600), "who wrote the book ?"
    know = muse.knowmem(embedded, [{"question": long, "answer": "a poet"}, {"question": short, "answer": "a poet"}],
                        [], n_mc=1, gen_length=4)
    assert know["lp_cut"] == 1 and know["prompts_cut"] == 1
    verb = muse.verbmem(embedded, [{"prompt": long, "gt": "the book was"}], n_mc=1, gen_length=4)
    assert verb["lp_cut"] == 1 and verb["prompts_cut"] == 1
    assert muse.verbmem(embedded, [{"prompt": long, "gt": "the book was"}], n_mc=1, gen_length=4,
                        rouge=False).keys() >= {"lp_cut"}
    probe = rwku.probes(embedded, [{"level": "2", "query": long, "answer": "a poet"}], n_mc=1, gen_length=4)
    assert probe["lp_cut"] == 1 and probe["prompts_cut"] == 1
    trivia = whp.trivia(embedded, [{"question": long, "true_answer": "yes", "false_answer": "no"},
                                   {"question": short, "true_answer": "yes", "false_answer": "no"}], n_mc=1)
    assert trivia["lp_cut"] == 1
    assert cut_counts({"knowmem_forget": know, "trivia": trivia, "privleak": {"cut": 0}}) == {
        "knowmem_forget": {"scored pairs": 1, "generation prompts": 1}, "trivia": {"scored pairs": 1}}


def test_a_block_length_that_does_not_divide_the_answer_is_refused(embedded):
    with pytest.raises(TimeromeError, match="block_length 4 does not divide the generation length 6"):
        sampler.continuations(embedded, ["Where was Isgor Quielson born ?"], gen_length=6, block_length=4)
    one = sampler.continuations(embedded, ["Where was Isgor Quielson born ?"], gen_length=6, block_length=6)
    assert one["texts"] == sampler.continuations(embedded, ["Where was Isgor Quielson born ?"], gen_length=6,
                                                 block_length=600)["texts"]  # longer than the answer: one block


def test_batched_generation_and_token_scores_do_not_depend_on_the_batch(embedded):
    prompts = ["Where was Isgor Quielson born ?", "What is the favourite colour of Isgor Quielson ?", "Who ?"]
    together = sampler.continuations(embedded, prompts, gen_length=6, batch_size=3)
    alone = [sampler.continuations(embedded, [p], gen_length=6)["texts"][0] for p in prompts]
    assert together["texts"] == alone and together["gen_length"] == 6
    # each answer's tokens, up to its end-of-text, are the text's
    assert [embedded.decode(i).strip() for i in together["ids"]] == together["texts"] and together["ids"][0]
    assert sampler.continuations(embedded, prompts[:1], gen_length=500)["gen_length"] == embedded.max_length // 2
    texts = ["Isgor Quielson was born in Pellmoor .", "Where ?"]
    both, _ = membership.token_scores(embedded, texts, groups=3, seed=1)
    first, _ = membership.token_scores(embedded, texts[:1], groups=3, seed=1)
    assert np.allclose(both[0], first[0], atol=1e-5)


def test_wmdp_letters_a_model_cannot_tell_apart_give_no_accuracy():
    # the embedded word vocabulary has no " A" .. " D": every question tied, and a tie picked A
    import timerome

    bb = timerome.load_backbone()
    assert "unknown to the model's vocabulary" in wmdp.letters_alike(bb, 4)
    rows = [{"question": "where was the author born ?", "choices": ["a", "b", "c", "d"], "answer": a} for a in (0, 1)]
    res = wmdp.score(bb, rows, n_mc=2)
    assert "letter_correct" not in res and "WMDP_Acc not scored" in res["letter_note"]
    assert "WMDP_Acc" not in wmdp.summary({"wmdp": res}) and "WMDP_AccChoice" in wmdp.summary({"wmdp": res})
    assert wmdp.letters_alike(Fake(favourite="C"), 4) is None


def test_kept_share_skips_a_condition_whose_rows_were_not_forgotten():
    """Row 0 forgotten by 10 nats, row 1 (the only paraphrased one) untouched: the paraphrase's
    original-on-its-rows is 0, which divided the share (ZeroDivisionError, stop 62's review)."""
    from timerome.experiments.robustness import kept_share

    conds = {"original": {"change": {"mean": -5.0}, "original": {"mean": -5.0}},
             "paraphrased_question": {"change": {"mean": 0.0}, "original": {"mean": 0.0}},
             "relearn": {"change": {"mean": -2.5}, "original": {"mean": -5.0}}}
    assert kept_share(conds) == pytest.approx(0.5)  # relearn keeps half; the paraphrase says nothing
    conds["relearn"]["original"]["mean"] = 0.5  # its rows moved up: nothing was forgotten there either
    assert kept_share(conds) is None


def test_the_robustness_panel_marks_a_cell_that_lost_a_seed_to_a_collapse():
    """A seed whose Δ is not finite (a collapsed model) was left out of the panel's cell without a mark: the
    cell read as the mean of every seed. It carries ‡ and the table the note."""
    from types import SimpleNamespace

    from timerome.experiments.report import DROPPED_MARK
    from timerome.experiments.robustness import panel, panel_markdown

    def items(lp, relearn):
        one = lambda v: {"index": [0], "lp": [v]}  # noqa: E731
        return {"original": one(lp), "paraphrased_question": {"index": [], "lp": []},
                "paraphrased_answer": {"index": [], "lp": []}, "relearn": one(relearn)}

    cells = [SimpleNamespace(row=r, measure="robustness", seed=s) for s in (0, 1, 2) for r in ("no_edit", "x")]
    edited = {0: items(-10.0, -5.0), 1: items(-12.0, float("nan")), 2: items(-11.0, -6.0)}
    results = [{"items": items(0.0, 0.0) if c.row == "no_edit" else edited[c.seed]} for c in cells]
    p = panel(cells, results)
    assert p["x"]["original"]["change"]["dropped"] == 0 and p["x"]["relearn"]["change"]["dropped"] == 1
    assert p["x"]["relearn"]["change"]["mean"] == pytest.approx(-5.5)  # over the two finite seeds
    md = panel_markdown(p)
    assert md.count(DROPPED_MARK) >= 2 and "were NaN or infinite" in md  # the change and weakening cells, the note


def test_token_scores_of_an_autoregressive_model_are_its_exact_next_token_log_probs(tmp_path):
    """As MUSE scores a causal LM: one clean forward, log p(x_i | x_<i), the first token (read from
    nothing: the tiny tokenizer adds no sequence start) dropped; groups and the seed not read."""
    import timerome
    from timerome.backbones.tiny import make_tiny_checkpoint

    bb = timerome.load_backbone(make_tiny_checkpoint("llama", tmp_path / "ar"))
    texts = ["the author was born in", "the author was"]
    scores, cut = membership.token_scores(bb, texts, groups=3, seed=0)
    again, _ = membership.token_scores(bb, texts, groups=8, seed=5)
    assert cut == 0 and bb.prompt_start == []
    for sentence, s, t in zip(texts, scores, again):
        ids = torch.tensor([bb.encode(sentence)])
        with torch.no_grad():
            lp = torch.log_softmax(bb.model(input_ids=ids).logits[0, :-1].float(), -1)
        want = lp.gather(1, ids[0, 1:, None])[:, 0].double().numpy()
        assert len(s) == ids.shape[1] - 1
        np.testing.assert_allclose(s, want, atol=1e-5)
        np.testing.assert_array_equal(s, t)
    with pytest.raises(TimeromeError, match="one token"):
        membership.token_scores(bb, ["author"])
    # the AUC's record says no masking groups were read (it said 8, the default, before stop 77)
    assert membership.min_k_auc(bb, texts[:1], texts[1:], groups=3)["groups"] is None
