"""engine/settings.py: one default per setting (sampler, likelihood, trace, edit), read by the API and the CLI alike."""

import dataclasses
import inspect

import pytest

from timerome.engine.likelihood import log_likelihood_batch
from timerome.engine.sampler import generate
from timerome.engine.settings import LIKELIHOOD, SAMPLER, TRACE
from timerome.metrics.text import pair_logprobs
from timerome.tracing.causal_trace import trace


def default(fn, name):
    return inspect.signature(fn).parameters[name].default


def test_the_api_reads_its_defaults_from_the_settings():
    for name in ("steps", "gen_length", "block_length", "temperature", "cfg_scale", "remasking"):
        assert default(generate, name) == getattr(SAMPLER, name), name
    assert default(log_likelihood_batch, "n_mc") == LIKELIHOOD.n_mc
    assert default(pair_logprobs, "n_mc") == LIKELIHOOD.n_mc
    assert default(trace, "steps") == TRACE.steps and default(trace, "n_samples") == TRACE.n_samples


def test_the_cli_reads_the_same_defaults(tmp_path):
    import json

    from typer.testing import CliRunner

    from timerome.cli import app
    from timerome.cli.evaluate import eval_cmd
    from timerome.cli.trace import trace_cmd

    # --n-mc is None until read (so that an autoregressive model's note names it only where given), its help
    # naming the default the command then reads
    assert default(eval_cmd, "n_mc").default is None and f"default {LIKELIHOOD.n_mc}" in default(eval_cmd, "n_mc").help
    assert default(trace_cmd, "n_facts").default == TRACE.n_facts
    # --steps is None until read (so that --positional can refuse it when given): the trace runs TRACE's
    res = CliRunner().invoke(app, ["trace", "--n-facts", "1", "--n-samples", "1", "-o", str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "t" / "trace.json").read_text())["settings"]["steps"] == TRACE.steps


def test_settings_are_frozen_values():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SAMPLER.steps = 3
    assert dataclasses.replace(SAMPLER, steps=64).steps == 64 and SAMPLER.steps == 128


def test_the_edit_defaults_are_the_paper_memorys_and_the_methods():
    from timerome.cli.evaluate import eval_cmd
    from timerome.engine.settings import EDIT
    from timerome.memory.edit_memory import EditMemory
    from timerome.methods import method_config

    sig = inspect.signature(EditMemory.__init__).parameters
    assert (sig["alpha"].default, sig["lam"].default, sig["q"].default, sig["key_metric"].default,
            sig["target"].default) == (EDIT.alpha, EDIT.lam, EDIT.q, EDIT.key_metric, EDIT.target)
    cfg = method_config("timerome")
    assert (cfg["alpha"], cfg["lam"], cfg["q"], cfg["key_metric"], cfg["target"]) == \
        (EDIT.alpha, EDIT.lam, EDIT.q, EDIT.key_metric, EDIT.target)
    assert default(eval_cmd, "target").default == EDIT.target
