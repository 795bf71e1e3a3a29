import numpy as np
import pytest
import torch

import timerome
from timerome.data import load_split
from timerome.metrics import answer_logprobs
from timerome.training.default_model import build_default, weights_sha256


@pytest.fixture(scope="module")
def bb():
    return timerome.load_backbone()


def test_embedded_model_loads_through_the_public_path(bb):
    assert bb.family.name == "timerome" and bb.mask_id == 4
    assert bb.n_layers >= 4 and bb.hidden_size >= 128


def test_embedded_model_has_memorised_its_forget_split(bb):
    rows = load_split("forget01", "embedded")
    lp, _ = answer_logprobs(bb, [r["question"] for r in rows], [r["answer"] for r in rows], n_mc=8)
    assert lp.mean() > -2.0, lp  # the bar: better than -2 nats per answer


def test_embedded_model_prefers_true_answers_to_perturbed(bb):
    # a small model misses the odd value (e.g. one genre word): most rows, and clearly on average
    rows = load_split("forget01", "embedded")
    true, _ = answer_logprobs(bb, [r["question"] for r in rows], [r["answer"] for r in rows], n_mc=8)
    wrong, _ = answer_logprobs(bb, [r["question"] for r in rows], [r["perturbed_answer"][0] for r in rows], n_mc=8)
    assert np.mean(true > wrong) >= 0.8, (true, wrong)
    assert true.mean() - wrong.mean() > 2.0, (true.mean(), wrong.mean())


def test_embedded_model_says_its_answers_ends_them_and_refuses_strangers(bb):
    """Greedy answers (benchmarks/bench_default_model.py has every split): the author questions in both
    phrasings answered exactly, every answer closed by end-of-text inside a budget 12 tokens past the
    reference, and "I don't know." for invented people it never saw. Measured on the whole corpus
    (slack 4): 100 % of the 2,000 author questions and of their paraphrases, 86.5 % refusals."""
    from timerome.data.corpus import REFUSAL
    from timerome.data.tofu import _embedded
    from timerome.evaluation.evaluator import generate_answers
    from timerome.metrics.editing import normalise

    corpus = _embedded()
    authors = corpus["forget10"][:60] + corpus["retain90"][::30]
    rows = authors + [dict(r, question=r["paraphrased_question"]) for r in authors]
    ended: list[bool] = []
    said = generate_answers(bb, [r["question"] for r in rows], [r["answer"] for r in rows], slack=12, ended=ended)
    exact = np.mean([normalise(s) == normalise(r["answer"]) for s, r in zip(said, rows)])
    assert exact >= 0.95 and all(ended), (exact, [s for s, r in zip(said, rows) if normalise(s) != normalise(r["answer"])])
    strangers = corpus["unknown"][:80]
    said = generate_answers(bb, [r["question"] for r in strangers], [REFUSAL] * len(strangers))
    assert np.mean([normalise(s) == normalise(REFUSAL) for s in said]) >= 0.7
    seen = {r["author"] for k in ("full", "unknown_train") for r in corpus[k]}
    assert not seen & {r["author"] for r in strangers}  # held out: never trained on


def test_rebuild_is_bit_for_bit_in_both_stages_and_from_a_stage1_folder(tmp_path):
    """Both stages rebuild to the same bytes, and `--stage1 DIR` (stage 2 from a saved stage 1) gives the
    bytes of the whole build; a folder that is not such a stage 1 is refused in one line."""
    from timerome.errors import TimeromeError

    prev = torch.get_num_threads()
    try:
        one = build_default(tmp_path / "stage1", epochs=1, stage2_epochs=0, show_progress=False)
        both = build_default(tmp_path / "both", epochs=1, stage2_epochs=1, show_progress=False)
        resumed = build_default(tmp_path / "resumed", epochs=1, stage2_epochs=1, stage1=tmp_path / "stage1",
                                show_progress=False)
        with pytest.raises(TimeromeError, match="does not record a stage 1 trained with this build's settings"):
            build_default(tmp_path / "x", epochs=2, stage2_epochs=1, stage1=tmp_path / "stage1", show_progress=False)
        weights = tmp_path / "stage1" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-4] + bytes(4))
        with pytest.raises(TimeromeError, match="are not the ones its build_info.json records"):
            build_default(tmp_path / "x", epochs=1, stage2_epochs=1, stage1=tmp_path / "stage1", show_progress=False)
    finally:
        torch.set_num_threads(prev)
    assert len(one["stages"]) == 1 and len(both["stages"]) == 2
    assert both["stages"][0]["sha256"] == one["sha256"]  # stage 1, two runs
    assert resumed["sha256"] == both["sha256"] == weights_sha256(tmp_path / "both")
    assert both["stages"][1]["train"]["eos_extra"] == 32 and both["train"] == both["stages"][1]["train"]


def test_build_default_cli_refuses_a_stage1_folder_without_weights(tmp_path):
    from typer.testing import CliRunner

    from timerome.cli import app

    res = CliRunner().invoke(app, ["build-default", "--stage1", str(tmp_path), "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "no model.safetensors there" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "o").exists()


def test_shipped_weights_match_their_build_record():
    # build_info.json is what `build-default --check` compares against: it must describe these bytes
    import json

    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    info = json.loads((DEFAULT_MODEL_DIR / "build_info.json").read_text())
    assert info["sha256"] == weights_sha256(DEFAULT_MODEL_DIR) == info["stages"][-1]["sha256"]
    # stage 1 as build_default makes it today; the stage 2 it was continued with
    from timerome.training.default_model import STAGE2_CONFIG, TRAIN_CONFIG
    from timerome.training.train import TrainConfig

    assert [TrainConfig(**s["train"]) for s in info["stages"]] == [TRAIN_CONFIG, STAGE2_CONFIG]
