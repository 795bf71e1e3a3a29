"""Training as everyday use: a fresh model of one's own, EOS padding, epoch checkpoints, Ctrl-C and
resume, progress lines in a log."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from timerome import load_backbone
from timerome.cli import app
from timerome.data.rows import load_rows
from timerome.errors import Interrupted, TimeromeError
from timerome.training.train import TrainConfig, eos_padded, train

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A tiny new model whose BPE tokenizer learnt the embedded forget05 rows."""
    from timerome.training.new_model import new_model

    d = tmp_path_factory.mktemp("new") / "model"
    new_model(["embedded:forget05"], d, size="tiny", vocab_size=600)
    return d


def test_new_model_is_a_llada_checkpoint_with_a_bpe_tokenizer(fresh, tmp_path):
    from timerome.training.new_model import new_model

    bb = load_backbone(fresh)
    cfg = json.loads((fresh / "config.json").read_text())
    assert bb.family.name == "llada" and cfg["architectures"] == ["LLaDAModelLM"] and bb.n_layers == 2
    assert bb.hidden_size == 64 and bb.mask_id == 4 and bb.tokenizer.eos_token_id == 3
    text = "Where was Ünïcode Zorblax born ?"  # never seen: byte-level BPE still encodes it, no unknown token
    assert bb.decode(bb.encode(text)) == text and bb.tokenizer.unk_token_id not in bb.encode(text)
    again = new_model(["embedded:forget05"], tmp_path / "again", size="tiny", vocab_size=600)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):  # same texts, size, seed: same files
        assert (fresh / name).read_bytes() == (Path(again["out"]) / name).read_bytes()


def test_eos_padding_follows_llada_sft():
    batch = [([1, 2], [5, 6, 7]), ([1], [5]), ([1, 2, 3, 4], [5, 6])]
    out = eos_padded(batch, eos=9, limit=64)
    assert [len(q) + len(a) for q, a in out] == [7, 7, 7]  # one past the longest row
    assert out[0][1] == [5, 6, 7, 9, 9] and out[1][1] == [5, 9, 9, 9, 9, 9] and out[2][1][-1] == 9
    assert eos_padded([([1] * 60, [5] * 4)], eos=9, limit=64)[0][1] == [5] * 4  # the context is the limit
    out = eos_padded(batch, eos=9, limit=64, counts=[1, 3, 2])  # eos_extra: each row its own count
    assert [a for _, a in out] == [[5, 6, 7, 9], [5, 9, 9, 9], [5, 6, 9, 9]]
    assert eos_padded([([1] * 60, [5] * 3)], eos=9, limit=64, counts=[5])[0][1] == [5, 5, 5, 9]


def test_eos_extra_draws_each_rows_eos_count_from_its_own_generator(fresh, monkeypatch):
    """eos_extra N: each row ends with 1..N + 1 EOS, drawn per row (every count is seen, the rows of
    a batch differ), the same draws for the same seed; a run without it is unchanged (no draw),
    and it needs eos_pad (one-line error)."""
    import timerome.training.train as T

    seen = []
    real = T.eos_padded
    monkeypatch.setattr(T, "eos_padded",
                        lambda batch, eos, limit, counts=None: seen.append(counts) or real(batch, eos, limit, counts))
    rows = load_rows("embedded:forget01")[:8]
    logs = []
    for extra in (6, 6, 0):
        seen.clear()
        logs.append((train(load_backbone(fresh), rows, TrainConfig(epochs=4, lr=1e-3, batch_size=2, eos_pad=True,
                                                                   eos_extra=extra), show_progress=False)["loss"],
                     list(seen)))
    (a, draws_a), (b, draws_b), (plain, draws_plain) = logs
    flat = [k for counts in draws_a for k in counts]
    assert a == b and draws_a == draws_b and set(flat) == set(range(1, 8))
    assert any(len(set(counts)) > 1 for counts in draws_a)  # per row, not per batch
    assert draws_plain == [None] * len(draws_plain) and plain != a
    with pytest.raises(TimeromeError, match=r"needs eos_pad \(--eos-pad\)"):
        train(load_backbone(fresh), rows, TrainConfig(epochs=1, eos_extra=2, eos_pad=False), show_progress=False)
    # likewise a LoRA scale without LoRA (read by nothing), before any work
    with pytest.raises(TimeromeError, match=r"lora_alpha scales LoRA adapters, and lora_r \(--lora-r\) is 0"):
        train(load_backbone(fresh), rows, TrainConfig(epochs=1, lora_alpha=16), show_progress=False)


def test_training_with_eos_padding_learns_to_end_answers(fresh, tmp_path):
    """A model trained with EOS padding puts EOS after the answer; one trained without does not."""
    rows = load_rows("embedded:forget01")[:4]
    probs = {}
    for eos_pad in (True, False):
        bb = load_backbone(fresh)
        train(bb, rows, TrainConfig(epochs=60, lr=3e-3, batch_size=4, eos_pad=eos_pad), show_progress=False)
        q, a = bb.encode(rows[0]["question"]), bb.encode(" " + rows[0]["answer"])
        ids = torch.tensor([q + a + [bb.mask_id] * 3])
        with torch.no_grad():
            p = bb.logits(ids)[0, len(q) + len(a):].softmax(-1)[:, bb.tokenizer.eos_token_id]
        probs[eos_pad] = float(p.mean())
    assert probs[True] > 0.5 > 0.05 > probs[False], probs


@pytest.mark.parametrize("lora_r", [0, 4])
def test_resume_reproduces_the_uninterrupted_run_exactly(fresh, tmp_path, lora_r):
    rows = load_rows("embedded:forget01")
    cfg = TrainConfig(epochs=3, lr=3e-3, batch_size=8, eos_pad=True, lora_r=lora_r)
    straight = load_backbone(fresh)
    plain = train(straight, rows, cfg, show_progress=False)

    def stop_after_two(epoch, log):
        if epoch == 2:
            raise KeyboardInterrupt

    state = tmp_path / "state"
    with pytest.raises(Interrupted, match=rf"after epoch 2 of 3 is saved in {state}"):
        train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=state, on_epoch=stop_after_two)
    resumed = load_backbone(fresh)
    log = train(resumed, rows, cfg, show_progress=False, checkpoint=state)
    assert log["resumed_at_epoch"] == 2 and log["loss"] == plain["loss"]
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit (LoRA: merged)
    # another recipe never continues this state, nor drops it without a word (it did, then overwrote it)
    with pytest.raises(TimeromeError, match="holds the state of another training .*after its epoch 3"):
        train(load_backbone(fresh), rows, TrainConfig(epochs=4, lr=3e-3, batch_size=8, eos_pad=True, lora_r=lora_r),
              show_progress=False, checkpoint=state)


def test_an_interrupt_at_any_point_of_a_save_leaves_one_epochs_state(fresh, tmp_path, monkeypatch):
    """A Ctrl-C that landed between the state's two writes (it was two files: weights, then record)
    left them of two epochs, and the resume refused the torn state (CI met it once). The state is one
    file now: an interrupt just after epoch 2's file is written reports epoch 2, and resumes there."""
    from timerome.training import train_state

    rows = load_rows("embedded:forget01")
    cfg = TrainConfig(epochs=3, lr=3e-3, batch_size=8, eos_pad=True)
    plain = train(load_backbone(fresh), rows, cfg, show_progress=False)
    real = train_state.save_tensors

    def written_then_interrupted(path, tensors, metadata=None):
        real(path, tensors, metadata)
        if json.loads(metadata["record"])["epoch"] == 2:
            raise KeyboardInterrupt  # inside save_state, after its write: the old layout's record was not yet written

    monkeypatch.setattr(train_state, "save_tensors", written_then_interrupted)
    state = tmp_path / "state"
    with pytest.raises(Interrupted, match=rf"after epoch 2 of 3 is saved in {state}"):
        train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=state)
    assert sorted(f.name for f in state.iterdir()) == ["state.safetensors"]
    monkeypatch.setattr(train_state, "save_tensors", real)
    log = train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=state)
    assert log["resumed_at_epoch"] == 2 and log["loss"] == plain["loss"]


def test_an_unreadable_state_and_another_tokenizers_state_are_refused(fresh, tmp_path):
    """A state with no record, a record that is not JSON, the earlier two-file layout: each one line
    naming the folder. A model of the same size and seed with another tokenizer starts from the same
    weights, and resumed another's state."""
    from timerome.common.cache import read_tensors, save_tensors
    from timerome.training.new_model import new_model

    rows = load_rows("embedded:forget01")
    cfg = TrainConfig(epochs=3, lr=3e-3, batch_size=8, eos_pad=True)

    def stop_at_one(epoch, log):
        if epoch == 1:
            raise KeyboardInterrupt

    state = tmp_path / "state"
    with pytest.raises(Interrupted):
        train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=state, on_epoch=stop_at_one)
    other = new_model(["embedded:forget01"], tmp_path / "other", size="tiny", vocab_size=600)  # same size and seed
    assert (Path(other["out"]) / "model.safetensors").read_bytes() == (fresh / "model.safetensors").read_bytes()
    with pytest.raises(TimeromeError, match="holds the state of another training"):
        train(load_backbone(other["out"]), rows, cfg, show_progress=False, checkpoint=state)
    tensors, _ = read_tensors(state / "state.safetensors")
    for metadata, message in ((None, "has no record of its epoch"), ({"record": "{epoch"}, "has an unreadable record"),
                              ({"record": "[1]"}, "has no record of its epoch")):
        bad = tmp_path / f"bad{len(message)}{metadata is None}"
        save_tensors(bad / "state.safetensors", tensors, metadata)
        with pytest.raises(TimeromeError, match=f"{bad}.*{message}.*delete {bad} to start over"):
            train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=bad)


def test_a_state_an_earlier_version_wrote_is_resumed(fresh, tmp_path):
    """Earlier versions wrote the state as two files: the tensors (their header naming the epoch and
    recipe), then state.json (the record). Such a state, of hours of training, is resumed (the first
    version of the one-file layout refused it), its files of two epochs are refused as torn, and the
    next epoch's save leaves one file."""
    import shutil

    from timerome.common.cache import read_tensors, save_tensors
    from timerome.training.train_state import saved_epoch

    rows = load_rows("embedded:forget01")
    cfg = TrainConfig(epochs=3, lr=3e-3, batch_size=8, eos_pad=True)
    plain = train(load_backbone(fresh), rows, cfg, show_progress=False)
    stops = {}
    for n in (1, 2):  # one-file states after epochs 1 and 2, rewritten in the earlier layout
        stops[n] = tmp_path / f"state{n}"

        def stop(epoch, log, n=n):
            if epoch == n:
                raise KeyboardInterrupt

        with pytest.raises(Interrupted):
            train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=stops[n], on_epoch=stop)
        tensors, header = read_tensors(stops[n] / "state.safetensors")
        record = json.loads(header["record"])
        save_tensors(stops[n] / "state.safetensors", tensors,
                     {"recipe": record["recipe"], "epoch": str(record["epoch"]), "step": str(record["step"])})
        (stops[n] / "state.json").write_text(json.dumps(record))
        assert saved_epoch(stops[n]) == n
    torn = shutil.copytree(stops[2], tmp_path / "torn")
    shutil.copy(stops[1] / "state.json", torn / "state.json")  # epoch 2's weights, epoch 1's record
    with pytest.raises(TimeromeError, match="is torn: its weights are of epoch 2, its record of epoch 1"):
        train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=torn)
    assert saved_epoch(torn) is None
    log = train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=stops[2])
    assert log["resumed_at_epoch"] == 2 and log["loss"] == plain["loss"]

    def stop_at_two(epoch, log):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted, match="after epoch 2 of 3"):  # resumed from epoch 1's earlier-layout state
        train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=stops[1], on_epoch=stop_at_two)
    assert sorted(f.name for f in stops[1].iterdir()) == ["state.safetensors"]  # one file now
    log = train(load_backbone(fresh), rows, cfg, show_progress=False, checkpoint=stops[1])
    assert log["resumed_at_epoch"] == 2 and log["loss"] == plain["loss"]


def test_eos_padding_needs_an_eos_token(fresh):
    bb = load_backbone(fresh)
    bb.tokenizer.eos_token = None
    with pytest.raises(TimeromeError, match="EOS"):
        train(bb, load_rows("embedded:forget01")[:2], TrainConfig(epochs=1, eos_pad=True), show_progress=False)


def test_cli_train_logs_progress_lines_and_resumes_after_ctrl_c(fresh, tmp_path):
    """`timerome train` off a terminal writes plain progress lines; SIGINT after an epoch says where the
    state is (exit 130); the same command then resumes there and finishes. 120 epochs (about 8 s): with
    30 (2 s), a stall of this process on a loaded machine once let the run end before the signal."""
    out = tmp_path / "trained"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TIMEROME_PROGRESS_SECONDS="0")
    cmd = [sys.executable, "-m", "timerome", "--threads", "1", "train", "--model", str(fresh), "--data",
           "embedded:forget01", "--out", str(out), "--epochs", "120", "--batch-size", "1", "--lr", "1e-3"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    state = out / "train-state" / "state.safetensors"
    t0 = time.time()
    while not state.exists() and time.time() - t0 < 120 and p.poll() is None:
        time.sleep(0.1)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err[-1500:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted: training stopped; its state after epoch") and "run the same command" in last
    assert not (out / "model.safetensors").exists()
    assert " elapsed" in err  # plain progress lines, not a silent log
    saved = int(last.split("after epoch ", 1)[1].split(" ", 1)[0])
    done = subprocess.run(cmd + ["--json"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-1500:]
    assert f"resuming after epoch {saved} of 120" in done.stderr
    summary = json.loads(done.stdout)
    assert summary["resumed_at_epoch"] == saved and summary["eos_pad"] is True
    assert (out / "model.safetensors").exists() and not (out / "train-state").exists()


def test_cli_train_stopped_while_saving_resumes_from_its_last_state(fresh, tmp_path, monkeypatch):
    """The state was deleted before the model's recipe was written: a Ctrl-C between the two left a model
    without build_info.json (its EOS padding then forgotten by the next fine-tune) and no state to go
    on from. The state goes last now: the same command finishes from it, without training again."""
    import timerome.common.cache as cache

    out = tmp_path / "trained"
    cmd = ["--threads", "1", "train", "--model", str(fresh), "--data", "embedded:forget01", "--out", str(out),
           "--epochs", "2", "--batch-size", "8", "--json"]
    real = cache.write_json

    def stopped(path, obj):
        if Path(path).name == "build_info.json":  # the model saved, its record not yet
            raise KeyboardInterrupt
        return real(path, obj)

    monkeypatch.setattr(cache, "write_json", stopped)
    res = runner.invoke(app, cmd)
    assert res.exit_code == 130, res.output
    assert (out / "train-state" / "state.safetensors").exists() and not (out / "build_info.json").exists()
    monkeypatch.setattr(cache, "write_json", real)
    res = runner.invoke(app, cmd)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["resumed_at_epoch"] == 2 and "resuming after epoch 2 of 2" in res.stderr
    assert json.loads((out / "build_info.json").read_text())["train"]["eos_pad"] is True
    assert not (out / "train-state").exists()


def test_cli_new_model_then_train(tmp_path):
    res = runner.invoke(app, ["new-model", "embedded:forget01", "-o", str(tmp_path / "m"), "--size", "tiny",
                              "--vocab-size", "400", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["dims"]["n_layers"] == 2 and info["vocab_size"] <= 400
    res = runner.invoke(app, ["new-model", "embedded:forget01", "-o", str(tmp_path / "m")])
    assert res.exit_code == 2 and "already holds a model" in res.output
    res = runner.invoke(app, ["train", "--model", str(tmp_path / "m"), "--data", "embedded:forget01", "--out",
                              str(tmp_path / "t"), "--epochs", "1", "--batch-size", "10", "--lr", "3e-3"])
    assert res.exit_code == 0 and "EOS padding on" in res.output, res.output
    assert "a first training" not in res.output  # --lr given: the user chose
    res = runner.invoke(app, ["train", "--model", str(tmp_path / "m"), "--data", "embedded:forget01", "--out",
                              str(tmp_path / "t1"), "--epochs", "1", "--no-checkpoint"])  # the fine-tuning lr: said
    assert res.exit_code == 0 and "the default lr 0.0001 fine-tunes a trained model" in " ".join(res.output.split())
    assert load_backbone(tmp_path / "t").family.name == "llada"
    res = runner.invoke(app, ["train", "--model", str(tmp_path / "m"), "--data", "embedded:forget01", "--out",
                              str(tmp_path / "t"), "--epochs", "1"])  # a model there, no state: refused
    assert res.exit_code == 2 and "already holds a model (config.json)" in res.output, res.output
    (tmp_path / "t" / "train-state").mkdir()  # a run stopped after its save, before its state went: resumed, so the
    (tmp_path / "t" / "train-state" / "state.safetensors").write_text("{}")  # state is read (this one, damaged)
    res = runner.invoke(app, ["train", "--model", str(tmp_path / "m"), "--data", "embedded:forget01", "--out",
                              str(tmp_path / "t"), "--epochs", "1"])
    assert res.exit_code == 2 and "already holds" not in res.output and "state.safetensors" in res.output, res.output
    res = runner.invoke(app, ["train", "--model", str(tmp_path / "m"), "--data", "embedded:forget01", "--out",
                              str(tmp_path / "d"), "--batch-size", "20", "--no-checkpoint"])  # the defaults
    assert res.exit_code == 0 and "is a new model (random weights)" in " ".join(res.output.split()), res.output
    words = " ".join(res.output.split())
    assert "lr 0.003, epochs 100 (timerome train --lr 0.003 --epochs 100)" in words  # train()'s own warning
    res = runner.invoke(app, ["train", "--model", str(tmp_path / "m"), "--data", "embedded:forget01", "--out",
                              str(tmp_path / "h"), "--dtype", "float16", "--no-checkpoint"])  # refused: no warning first
    assert res.exit_code == 2 and "float16 is refused" in res.output and "new model" not in res.output, res.output
    res = runner.invoke(app, ["train", "--model", str(tmp_path / "d"), "--data", "embedded:forget01", "--out",
                              str(tmp_path / "e"), "--epochs", "1", "--no-checkpoint"])  # trained once: no note
    assert res.exit_code == 0 and "new model" not in res.output, res.output


def test_new_model_says_when_its_rows_do_not_fit_its_context(tmp_path):
    """The longest row, counted as `timerome train` counts it: a context one token short is warned about at
    new-model (train then refuses that row), the longest row's own length is not."""
    res = runner.invoke(app, ["new-model", "embedded:forget01", "-o", str(tmp_path / "a"), "--size", "tiny",
                              "--vocab-size", "400", "--json"])
    assert res.exit_code == 0 and "warning" not in res.stderr, res.output
    longest = json.loads(res.stdout)["longest_row"]
    for context, warned in ((longest - 1, True), (longest, False)):
        m = tmp_path / f"c{context}"
        res = runner.invoke(app, ["new-model", "embedded:forget01", "-o", str(m), "--size", "tiny", "--vocab-size",
                                  "400", "--context", str(context)])
        assert res.exit_code == 0 and (f"rows take up to {longest} tokens" in " ".join(res.stderr.split())) == warned
        res = runner.invoke(app, ["train", "--model", str(m), "--data", "embedded:forget01", "--out", str(m) + "t",
                                  "--epochs", "1", "--no-checkpoint"])
        assert (res.exit_code == 2 and "over the model's context" in res.output) == warned, res.output
    from timerome.training.new_model import new_model

    with pytest.warns(UserWarning, match=f"rows take up to {longest} tokens"):  # the API says it too
        new_model(["embedded:forget01"], tmp_path / "api", size="tiny", vocab_size=400, context=longest - 1)
    # text files alone give no rows to count: nothing said
    (tmp_path / "t.txt").write_text("one line of text\nanother line\n")
    res = runner.invoke(app, ["new-model", str(tmp_path / "t.txt"), "-o", str(tmp_path / "txt"), "--size", "tiny",
                              "--vocab-size", "300", "--context", "2", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["longest_row"] is None, res.output


def test_a_new_models_first_training_settings_make_it_answer(tmp_path):
    """The settings `new-model` prints for a first training make a new model answer its rows, where the
    fine-tuning defaults leave it silent (FIRST_TRAINING's measurement: forget10's 200 rows, about 25 s)."""
    from timerome.engine.sampler import continuations
    from timerome.training.config import FIRST_TRAINING
    from timerome.training.new_model import new_model

    new_model(["embedded:full"], tmp_path / "m", size="tiny", vocab_size=1000, context=128)
    rows = load_rows("embedded:forget10")
    said = {}
    for name, cfg in (("default", TrainConfig()), ("first", TrainConfig(**FIRST_TRAINING))):
        bb = load_backbone(tmp_path / "m")
        train(bb, rows, cfg, show_progress=False)
        said[name] = continuations(bb, [rows[0]["question"]], gen_length=16)["texts"][0].strip()
    frame = " ".join(rows[0]["answer"].split()[:5])  # "Danra Mirodard was born in": the answer's frame, fluent
    assert said["default"] == "" and said["first"].startswith(frame), said


def test_training_twice_divergence_float16_and_bad_arguments(fresh, tmp_path, monkeypatch):
    """A second training of one backbone trains it (the first gave back the parameters' requires_grad as it
    found them); a diverged run stops at once with its resumable state removed, so a run with a lower learning
    rate starts there; float16 and wrong argument types are one-line errors."""
    rows = load_rows("embedded:forget01")[:8]
    bb = load_backbone(fresh)
    frozen = next(bb.model.parameters())
    frozen.requires_grad_(False)  # the caller's own choice: kept
    before = frozen.detach().clone()
    first = train(bb, rows, {"epochs": 1, "batch_size": 8}, show_progress=False)
    second = train(bb, rows, TrainConfig(epochs=1, batch_size=8), show_progress=False)
    assert len(first["loss"]) == len(second["loss"]) == 1 and second["loss"][0] != first["loss"][0]
    assert not frozen.requires_grad and torch.equal(frozen, before)
    assert all(p.requires_grad for p in list(bb.model.parameters())[1:])

    state = tmp_path / "state"
    with pytest.raises(TimeromeError, match="diverged at epoch 2, step 1: the loss is nan.*state in .* is removed"):
        train(load_backbone(fresh), rows, TrainConfig(epochs=3, batch_size=8, lr=1e20), show_progress=False,
              checkpoint=state)
    assert not (state / "state.safetensors").exists()  # epoch 1's state (its weights finite) is gone too
    log = train(load_backbone(fresh), rows, TrainConfig(epochs=2, batch_size=8, lr=1e-3), show_progress=False,
                checkpoint=state)
    assert log["resumed_at_epoch"] == 0 and all(map(torch.isfinite, torch.tensor(log["loss"])))
    with pytest.raises(TimeromeError, match="step size overflows"):
        train(load_backbone(fresh), rows, TrainConfig(epochs=1, lr=1e38), show_progress=False)
    with pytest.raises(TimeromeError, match="full fine-tuning in float16 is refused"):
        train(load_backbone(fresh, dtype="float16"), rows, TrainConfig(epochs=1), show_progress=False)
    half = load_backbone(fresh, dtype="float16")  # LoRA: float32 adapters over the frozen float16 weights, allowed
    log = train(half, rows, TrainConfig(epochs=2, batch_size=8, lr=1e-3, lora_r=4), show_progress=False)
    assert all(map(math.isfinite, log["loss"])) and all(bool(torch.isfinite(p).all()) for p in half.model.parameters())
    for bad, match in (("rows.jsonl", "got the path 'rows.jsonl'.*load_rows"),
                       ([{"q": 1}], "training row 0 lacks question/answer: no question field"),
                       ([{"question": "q", "answer": 3}], "row 0: its answer must be a text, got int 3"),
                       ([{"question": "q", "answer": " "}], "row 0 lacks question/answer: its answer is blank"),
                       ([], "no training rows"), (["q"], "training row 0 lacks question/answer: it is a str")):
        with pytest.raises(TimeromeError, match=match):
            train(bb, bad, show_progress=False)
    assert len(train(bb, (r for r in rows), {"epochs": 1, "batch_size": 8}, show_progress=False)["loss"]) == 1
    with pytest.raises(TimeromeError, match="rows must be a list"):
        train(bb, {"question": "q", "answer": "a"}, show_progress=False)
    with pytest.raises(TimeromeError, match="unknown training setting 'epoch'"):
        train(bb, rows, {"epoch": 1}, show_progress=False)
    with pytest.raises(TimeromeError, match="config must be a TrainConfig"):
        train(bb, rows, 3, show_progress=False)
    real_step = torch.optim.AdamW.step

    def poisoned(self, *args, **kwargs):  # a last step whose loss was finite and whose weights are not
        out = real_step(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0].fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned)
    with pytest.raises(TimeromeError, match="diverged at epoch 1, step 1: a weight is not finite.*no model was saved"):
        train(load_backbone(fresh), rows, TrainConfig(epochs=1, batch_size=8), show_progress=False)  # no checkpoint


def test_cli_train_keeps_the_checkpoints_own_eos_recipe(tmp_path):
    """`timerome train` pads answers with EOS by default where the checkpoint was built so (the
    embedded default's build_info.json records it) and not for a model of its family that records
    nothing (such as the TOFU fixture, trained without)."""
    from timerome.backbones.loading import DEFAULT_MODEL_DIR
    from timerome.training.train import trained_with_eos_padding

    assert trained_with_eos_padding(DEFAULT_MODEL_DIR) is True
    assert trained_with_eos_padding(tmp_path) is None
    (tmp_path / "build_info.json").write_text("[]")  # not a record: no answer, no crash
    assert trained_with_eos_padding(tmp_path) is None
    res = runner.invoke(app, ["--threads", "1", "train", "--data", "embedded:forget01", "--epochs", "1",
                              "--out", str(tmp_path / "ft"), "--json", "--no-checkpoint"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["eos_pad"] is True
    assert trained_with_eos_padding(tmp_path / "ft") is True  # recorded: a second fine-tune keeps it (it fell off)
    res = runner.invoke(app, ["--threads", "1", "train", "--model", str(tmp_path / "ft"), "--data",
                              "embedded:forget01", "--epochs", "1", "--out", str(tmp_path / "ft3"), "--json",
                              "--no-checkpoint"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["eos_pad"] is True
    bare = tmp_path / "bare"  # the embedded default's files without its build record
    bare.mkdir()
    for f in DEFAULT_MODEL_DIR.iterdir():
        if f.is_file() and f.name != "build_info.json":
            (bare / f.name).write_bytes(f.read_bytes())
    res = runner.invoke(app, ["--threads", "1", "train", "--model", str(bare), "--data", "embedded:forget01",
                              "--epochs", "1", "--out", str(tmp_path / "ft2"), "--json", "--no-checkpoint"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["eos_pad"] is False


def test_cli_train_eos_extra(tmp_path):
    """`timerome train --eos-extra N` trains with it (and reports it); a negative N, or N without EOS
    padding, is one line of error before any training."""
    res = runner.invoke(app, ["--threads", "1", "train", "--data", "embedded:forget01", "--epochs", "1",
                              "--eos-extra", "4", "--out", str(tmp_path / "ft"), "--json", "--no-checkpoint"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["eos_extra"] == 4
    for bad, says in ((["--eos-extra", "-1"], "--eos-extra must be >= 0"),
                      (["--eos-extra", "2", "--no-eos-pad"], "needs eos_pad (--eos-pad)")):
        res = runner.invoke(app, ["train", "--data", "embedded:forget01", "--epochs", "1", "--out",
                                  str(tmp_path / "bad"), *bad])
        assert res.exit_code != 0 and says in res.output and "Traceback" not in res.output, res.output


def test_a_reference_model_is_keyed_by_the_tokenizer_not_its_size(fresh, tmp_path):
    """_own_recipe named the tokenizer by its length: two models of one size and seed whose BPEs learnt
    other texts shared one cached reference, the second scored against the first's tokenizer."""
    from timerome.common.cache import digest
    from timerome.training.from_scratch import _own_recipe
    from timerome.training.new_model import new_model

    other = load_backbone(new_model(["embedded:forget01"], tmp_path / "other", size="tiny", vocab_size=600)["out"])
    mine = load_backbone(fresh)
    rows = load_rows("embedded:retain_perturbed")[:4]
    assert len(mine.tokenizer) == len(other.tokenizer) == 600  # what the recipe read: one value for both
    a, b = (_own_recipe(bb, rows, None, 1)[0] for bb in (mine, other))
    assert a["tokenizer"] != b["tokenizer"] and digest(a, 16) != digest(b, 16)
    assert _own_recipe(load_backbone(fresh), rows, None, 1)[0] == a  # the same model: the same reference


def test_text_holding_a_special_token_is_refused_not_learnt(fresh, tmp_path):
    """A row "It is <|eos|> in this model." trained the model to end answers mid-way (its text is read
    as the end-of-text id); decoding hides it (stop 62's training audit)."""
    from timerome.training.new_model import new_model

    rows = [{"question": "What is it ?", "answer": "It is <|eos|> in this model."}]
    with pytest.raises(TimeromeError, match="row 0 holds the text of the tokenizer's special token '<\\|eos\\|>'"):
        train(load_backbone(fresh), rows, TrainConfig(epochs=1), show_progress=False)
    with pytest.raises(TimeromeError, match="row 0 holds the text of the tokenizer's special token '<\\|mask\\|>'"):
        train(load_backbone(), [{"question": "Where is <|mask|> ?", "answer": "here ."}], TrainConfig(epochs=1),
              show_progress=False)
    (tmp_path / "t.txt").write_text("a line\nthe end <|eos|> of it\n")
    with pytest.raises(TimeromeError, match="holds '<\\|eos\\|>', the new tokenizer's special token"):
        new_model([str(tmp_path / "t.txt")], tmp_path / "m", size="tiny", vocab_size=300)
    # a word the embedded model's vocabulary lacks is its unknown token: that is not a special text (warned of)
    assert train(load_backbone(), [{"question": "Where was Zorblax born ?", "answer": "Quux ."}],
                 TrainConfig(epochs=1, batch_size=1), show_progress=False)["loss"]


def test_a_lora_rank_over_the_layers_width_is_refused():
    """--lora-r 100000 on a 128-wide model trained for seconds and a lot of memory, an adapter that
    spans no more than rank 128 (stop 62's training audit)."""
    rows = [{"question": "Where was Isgor Quielson born ?", "answer": "Lunsford ."}]
    with pytest.raises(TimeromeError, match="lora_r 129 is over the rank a 128-wide layer can take"):
        train(load_backbone(), rows, TrainConfig(epochs=1, lora_r=129, batch_size=1), show_progress=False)
    assert train(load_backbone(), rows, TrainConfig(epochs=1, lora_r=128, batch_size=1), show_progress=False)["loss"]


def test_a_row_that_fills_the_context_is_said_to_get_no_end_of_text():
    from timerome.engine.encoding import encode_pairs

    bb = load_backbone()
    row = {"question": "Where was Isgor Quielson born ?", "answer": "Lunsford ."}
    q, a = encode_pairs(bb, [row])[0]
    bb.max_length = len(q) + len(a)  # the row fills it: EOS padding has no room left
    with pytest.warns(UserWarning, match="1 rows .* fill the model's context .* get no end-of-text"):
        train(bb, [row], TrainConfig(epochs=1, batch_size=1, eos_pad=True), show_progress=False)


def test_a_scored_question_may_hold_special_text():
    """The refusal is for training: a question that is scored or answered may hold any text."""
    from timerome.engine.likelihood import answer_logprobs

    lp, _ = answer_logprobs(load_backbone(), ["Where was <|eos|> born ?"], ["Lunsford ."], n_mc=1)
    assert lp.shape == (1,)


def test_the_api_pads_with_eos_by_the_checkpoints_recipe_as_the_cli_does(fresh):
    """TrainConfig(eos_pad=None), the default, is the checkpoint's recipe, as `timerome train` reads it: the
    embedded default records EOS padding (on), a new-model checkpoint has an EOS (on), the TOFU-style
    models of the embedded family without a record were trained without it (off). The API's default was
    off before, so training the embedded default from Python dropped the padding it was built with."""
    from dataclasses import replace

    from timerome.training.train import recipe_eos_pad

    assert TrainConfig().eos_pad is None
    default, new = load_backbone(), load_backbone(fresh)
    assert recipe_eos_pad(default) is True and recipe_eos_pad(new) is True
    unrecorded = load_backbone()
    unrecorded.info = dict(unrecorded.info, checkpoint=None)   # no build_info.json to read
    assert recipe_eos_pad(unrecorded) is False
    rows = [{"question": "Where was Isgor Quielson born ?", "answer": "Lunsford ."}]
    log = train(default, rows, TrainConfig(epochs=1, batch_size=1), show_progress=False)
    assert log["config"]["eos_pad"] is True   # resolved before the log (and a resumable state) records it
    assert train(unrecorded, rows, TrainConfig(epochs=1, batch_size=1), show_progress=False)["config"]["eos_pad"] is False
    with pytest.raises(TimeromeError, match="eos_pad .* must be True, False or None"):
        train(new, rows, replace(TrainConfig(epochs=1), eos_pad="yes"), show_progress=False)


def test_a_trained_reference_follows_the_models_recipe_and_its_cache_name_says_so(fresh):
    """reference="train" (a model of the same architecture trained on the retain rows) pads with EOS as the
    model's recipe does (a new-model checkpoint: on); the recipe's digest, its cache name, then holds
    eos_pad, so no reference trained without it before answers for it; a recipe without EOS padding
    keeps the name it had (review of stop 64: the unresolved default left the name and changed the model)."""
    from timerome.experiments.runner import Context
    from timerome.training.from_scratch import _own_recipe

    rows = load_rows("embedded:retain90")[:4]
    new = load_backbone(fresh)
    recipe, _, _, tcfg = _own_recipe(new, rows, None, 1)
    assert tcfg.eos_pad is True and recipe["train"]["eos_pad"] is True
    off, _, _, tcfg_off = _own_recipe(new, rows, TrainConfig(eos_pad=False), 1)
    assert tcfg_off.eos_pad is False and "eos_pad" not in off["train"]
    assert Context(new, reference="train").reference_tag["eos_pad"] is True
    unrecorded = load_backbone()
    unrecorded.info = dict(unrecorded.info, checkpoint=None)  # the embedded family without a record: off
    assert "eos_pad" not in Context(unrecorded, reference="train").reference_tag
