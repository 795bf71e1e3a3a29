"""Damaged or inconsistent local checkpoints, built from the golden fixtures: each is refused at load with one
TimeromeError naming what is wrong (and, through the command line, one "error:" line and exit code 2), never
loaded with random or dropped weights, wrong numbers or a traceback."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from conftest import FIXTURES  # the golden fixtures, read only: every case changes a copy
from typer.testing import CliRunner

from timerome import TimeromeError, load_backbone
from timerome.backbones.loading import DEFAULT_MODEL_DIR
from timerome.cli.app import app

runner = CliRunner()


def checkpoint(tmp_path: Path, family: str, *, config=None, weights=None, files=None, drop=()) -> Path:
    """A copy of a golden fixture with config.json keys set (a dict, or dict -> dict), the weights changed
    (state -> state), files written ({name: text}) or removed."""
    src = FIXTURES / family / "checkpoint"
    assert src.is_dir(), f"no golden fixture for {family} at {src}"
    d = tmp_path / family
    shutil.copytree(src, d)
    if config is not None:
        cfg = json.loads((d / "config.json").read_text())
        cfg = config(cfg) if callable(config) else {**cfg, **config}
        (d / "config.json").write_text(json.dumps(cfg))
    if weights is not None:
        save_file(weights(load_file(str(d / "model.safetensors"))), str(d / "model.safetensors"),
                  metadata={"format": "pt"})
    for name, text in (files or {}).items():
        (d / name).write_text(text)
    for name in drop:
        (d / name).unlink()
    return d


def sharded(d: Path, index=None, shards=None) -> Path:
    """The checkpoint's model.safetensors split in two shards with an index; index(doc) and shards(a, b)
    change them."""
    state = load_file(str(d / "model.safetensors"))
    names = sorted(state)
    half = len(names) // 2
    a = {k: state[k] for k in names[:half]}
    b = {k: state[k] for k in names[half:]}
    files = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    if shards is not None:
        a, b = shards(a, b)
    for part, name in zip((a, b), files):
        save_file(part, str(d / name), metadata={"format": "pt"})
    doc = {"metadata": {}, "weight_map": {k: files[i >= half] for i, k in enumerate(names)}}
    if index is not None:
        doc = index(doc)
    (d / "model.safetensors.index.json").write_text(json.dumps(doc))
    (d / "model.safetensors").unlink()
    return d


def without(*names):
    return lambda state: {k: v for k, v in state.items() if k not in names}


def refused(d: Path, *needles: str) -> str:
    with pytest.raises(TimeromeError) as caught:
        load_backbone(d)
    message = str(caught.value)
    for needle in needles:
        assert needle in message, message
    return message


def cli_refused(d: Path, needle: str) -> None:
    res = runner.invoke(app, ["info", "-m", str(d)])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output, res.output
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.output


def logits(bb):
    return bb.logits(torch.tensor([bb.encode("hello world")]))


# ------------------------------------------------ 1. weights transformers would fill randomly or drop


def test_diffullama_missing_final_norm(tmp_path):
    d = checkpoint(tmp_path, "diffullama", weights=without("model.norm.weight"))
    refused(d, f"weights in {d} do not fit the diffullama structure: model.norm.weight is missing")
    cli_refused(d, "model.norm.weight is missing")


def test_dream_missing_lm_head_but_tied_embeddings_load(tmp_path):
    d = checkpoint(tmp_path / "a", "dream", weights=without("lm_head.weight"))
    refused(d, "do not fit the dream structure: lm_head.weight is missing")
    # tied embeddings: a checkpoint without lm_head is whole, the head is the embedding
    tied = checkpoint(tmp_path / "b", "dream", config={"tie_word_embeddings": True},
                      weights=without("lm_head.weight"))
    bb = load_backbone(tied)
    assert torch.isfinite(logits(bb)).all()


@pytest.mark.parametrize("family,layers,needle", [
    ("dream", 1, "model.layers.1.input_layernorm.weight is not part of it (and 11 more)"),  # a layer dropped
    ("diffullama", 3, "model.layers.2.input_layernorm.weight is missing (and 8 more)"),  # a random layer
])
def test_layer_count_that_does_not_fit_the_weights(tmp_path, family, layers, needle):
    d = checkpoint(tmp_path, family, config={"num_hidden_layers": layers, **(
        {"max_window_layers": layers} if family == "dream" else {})})
    refused(d, f"do not fit the {family} structure: {needle}")


def test_extra_tensor_and_misshapen_tensor(tmp_path):
    def extra(state):
        return {**state, "model.layers.0.mlp.bogus.weight": torch.zeros(3)}

    d = checkpoint(tmp_path / "a", "dream", weights=extra)
    refused(d, "model.layers.0.mlp.bogus.weight is not part of it")
    d = checkpoint(tmp_path / "b", "diffullama", config={"intermediate_size": 100})
    refused(d, "model.layers.0.mlp.down_proj.weight has shape [64, 172] where the structure needs [64, 100]")


@pytest.mark.parametrize("family", ["dream", "diffullama"])
def test_index_that_leaves_out_tensors(tmp_path, family):
    # the index forgets every tensor of the second shard (the file is still there)
    d = sharded(checkpoint(tmp_path, family), index=lambda doc: {
        **doc, "weight_map": {k: v for k, v in doc["weight_map"].items() if "00001" in v}})
    refused(d, f"do not fit the {family} structure: ", "is missing (and ")


def test_two_loads_of_a_broken_checkpoint_never_give_a_fingerprint(tmp_path):
    d = checkpoint(tmp_path, "diffullama", config={"num_hidden_layers": 3})
    for _ in range(2):  # the fingerprint cache keyed by file stats once gave two random models one fingerprint
        refused(d, "is missing")


# ------------------------------------------------ 2. a tensor in two shards


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_tensor_in_two_shards(tmp_path, family):
    def dup(a, b):
        k = sorted(a)[0]
        return a, {**b, k: a[k] * 0 + 7}

    d = sharded(checkpoint(tmp_path, family), shards=dup)
    refused(d, "is in two shards of", "model-00001-of-00002.safetensors and model-00002-of-00002.safetensors")
    if family == "llada":
        cli_refused(d, "is in two shards of")


def test_index_that_puts_a_tensor_in_the_wrong_shard(tmp_path):
    def wrong(doc):
        k = sorted(doc["weight_map"])[0]
        doc["weight_map"][k] = "model-00002-of-00002.safetensors"
        return doc

    d = sharded(checkpoint(tmp_path, "llada"), index=wrong)
    refused(d, "model-00002-of-00002.safetensors, which does not hold it (model-00001-of-00002.safetensors does)")


# ------------------------------------------------ 3. a RoPE base that makes every output NaN


@pytest.mark.parametrize("family,config", [
    ("llada", {"rope_theta": 1e-300}),
    ("dream", {"rope_theta": 1e-300}),
    ("diffullama", {"rope_theta": 0.5}),
    ("dream", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e-300}}),
])
def test_rope_theta_not_above_one(tmp_path, family, config):
    d = checkpoint(tmp_path, family, config=config)
    key = next(iter(config))
    refused(d, f"{d / 'config.json'}: {key} must be", "a finite number > 1")
    if family == "llada":
        cli_refused(d, "rope_theta must be a finite number > 1")


# ------------------------------------------------ 4, 5. the mask token


def test_config_mask_id_contradicts_the_tokenizer(tmp_path):
    d = checkpoint(tmp_path, "dream", config={"mask_token_id": 100})
    refused(d, "mask_token_id 100", "'<|mask|>' is id 292")


def test_tokenizer_mask_token_not_in_the_vocabulary(tmp_path):
    src = json.loads((FIXTURES / "dream" / "checkpoint" / "tokenizer_config.json").read_text())
    d = checkpoint(tmp_path, "dream", config=lambda c: {k: v for k, v in c.items() if k != "mask_token_id"},
                   files={"tokenizer_config.json": json.dumps({**src, "mask_token": "<|nosuchmask|>"})})
    refused(d, "mask token '<|nosuchmask|>', which is not in its vocabulary", "untrained id 293")


@pytest.mark.parametrize("family, role, name", [("llada", "eos", "end-of-text"), ("llada", "pad", "padding"),
                                                ("llada", "bos", "start"), ("dream", "eos", "end-of-text")])
def test_tokenizer_special_token_not_in_the_vocabulary(tmp_path, family, role, name):
    """An end-of-text, padding or start token the vocabulary lacks is refused as the mask token is (review 88:
    transformers appended '<|invented|>' as id 306 of llada's padded 320-row embedding, an untrained row read
    as the end of every answer, and `generate` wrote garbage with exit 0); the CLI says it in one line."""
    files = {}
    for f in ("tokenizer_config.json", "special_tokens_map.json"):
        cfg = json.loads((FIXTURES / family / "checkpoint" / f).read_text())
        files[f] = json.dumps({**cfg, f"{role}_token": "<|invented|>"})
    d = checkpoint(tmp_path, family, files=files)
    refused(d, f"{name} token '<|invented|>', which is not in its vocabulary", f"its {role}_token", "untrained id")
    cli_refused(d, f"{name} token '<|invented|>'")


# ------------------------------------------------ 6. a tokenizer larger than the embedding


def test_tokenizer_larger_than_the_embedding(tmp_path):
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    d = checkpoint(tmp_path, "llada", files={n: (DEFAULT_MODEL_DIR / n).read_text() for n in names})
    refused(d, "the tokenizer has 1170 tokens, the model's embedding 320")
    cli_refused(d, "the tokenizer has 1170 tokens, the model's embedding 320")


# ------------------------------------------------ 7. wrong-typed values: one line, file and key


def test_float_mlp_ratio_that_gives_a_whole_width_loads(tmp_path):
    # mlp_ratio 3.0 * d_model 64 = 192 units, the fixture's own mlp_hidden_size: the same model
    d = checkpoint(tmp_path / "a", "llada", config={"mlp_hidden_size": None, "mlp_ratio": 3.0})
    golden = load_backbone(FIXTURES / "llada" / "checkpoint")
    assert torch.equal(logits(load_backbone(d)), logits(golden))
    d = checkpoint(tmp_path / "b", "llada", config={"mlp_hidden_size": None, "mlp_ratio": 2.3})
    refused(d, f"{d / 'config.json'}: mlp_hidden_size is null", "mlp_ratio 2.3 * d_model 64 is not a whole number")


@pytest.mark.parametrize("family,config,needle", [
    ("llada-moe", {"router_num_group": "2"}, "router_num_group must be an integer >= 1 or null, got '2'"),
    ("llada-moe", {"router_topk_group": [1]}, "router_topk_group must be an integer >= 1 or null, got [1]"),
    ("dream", {"rope_parameters": "default"}, "rope_parameters must be an object"),
    ("dream", {"layer_types": 5}, "layer_types must be a list of layer type names"),
    ("llada", {"architectures": 5}, "config.json: architectures must be a list of class names or null, got 5"),
    ("llada", {"auto_map": ["x"]}, "config.json: auto_map must be an object"),
])
def test_wrong_typed_config_value(tmp_path, family, config, needle):
    d = checkpoint(tmp_path, family, config=config)
    refused(d, needle)


@pytest.mark.parametrize("change,needle", [
    (lambda c: [1, 2], "tokenizer_config.json must be a JSON object"),
    (lambda c: {**c, "auto_map": "x"}, "tokenizer_config.json: auto_map must be an object"),
    (lambda c: {**c, "tokenizer_class": 5}, "tokenizer_config.json: tokenizer_class must be a class name"),
])
def test_wrong_typed_tokenizer_config(tmp_path, change, needle):
    src = json.loads((FIXTURES / "llada" / "checkpoint" / "tokenizer_config.json").read_text())
    d = checkpoint(tmp_path, "llada", files={"tokenizer_config.json": json.dumps(change(src))})
    refused(d, needle)
    if isinstance(change(src), list):
        cli_refused(d, needle)


# ------------------------------------------------ 8. transformers' refusals blamed on the right file


@pytest.mark.parametrize("config,needle", [
    ({"hidden_act": None}, "hidden_act None is refused by transformers'"),
    ({"pretraining_tp": "x"}, "pretraining_tp 'x' is refused by transformers'"),
    ({"rope_scaling": "linear"}, "rope_scaling 'linear' is refused by transformers'"),
    ({"hidden_act": "nonsense"}, "hidden_act must be the name of an activation transformers knows"),
    ({"rope_scaling": {"rope_type": "bogus"}}, "rope_scaling must be an object with a RoPE type transformers knows"),
])
def test_transformers_config_refusal_names_config_json(tmp_path, config, needle):
    d = checkpoint(tmp_path, "diffullama", config=config)
    message = refused(d, f"{d / 'config.json'}: ", needle)
    assert "tokenizer" not in message and "do not fit" not in message, message
    if "hidden_act" in config and config["hidden_act"] is None:
        cli_refused(d, "hidden_act None is refused")


def test_dream_missing_shard_and_listed_weight_map(tmp_path):
    d = sharded(checkpoint(tmp_path / "a", "dream"))
    (d / "model-00002-of-00002.safetensors").unlink()
    refused(d, "model.safetensors.index.json names the shard model-00002-of-00002.safetensors, which is missing")
    d = sharded(checkpoint(tmp_path / "b", "dream"),
                index=lambda doc: {**doc, "weight_map": list(doc["weight_map"].items())})
    refused(d, "model.safetensors.index.json has no weight_map object")


def test_transformers_weight_reports_are_off_while_a_load_refuses_them():
    """transformers' reports of missing / unused weights are off inside a load, which refuses those in one line:
    5.x's LOAD REPORT and (stop 81) 4.x's two "Some weights of ..." paragraphs. Its other warnings stay, and the
    reports come back after the load."""
    import logging

    from timerome.backbones.loading import _load_report_off

    log, seen = logging.getLogger("transformers.modeling_utils"), []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep(level=logging.WARNING)
    log.addHandler(keep)
    try:
        with _load_report_off():
            log.warning("Some weights of LlamaForCausalLM were not initialized from the model checkpoint at x and "
                        "are newly initialized: ['lm_head.weight']")
            log.warning("Some weights of the model checkpoint at x were not used when initializing LlamaForCausalLM")
            log.warning("LlamaForCausalLM LOAD REPORT from: x")
            log.warning("another warning")
        log.warning("Some weights of Y were not initialized from the model checkpoint at z")
    finally:
        log.removeHandler(keep)
    assert seen == ["another warning", "Some weights of Y were not initialized from the model checkpoint at z"], seen
