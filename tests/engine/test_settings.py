"""engine/settings.py: one default per setting, read by the API and the CLI alike."""

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


def test_the_cli_reads_the_same_defaults():
    from timerome.cli.evaluate import eval_cmd
    from timerome.cli.trace import trace_cmd

    assert default(eval_cmd, "n_mc").default == LIKELIHOOD.n_mc
    assert default(trace_cmd, "steps").default == TRACE.steps
    assert default(trace_cmd, "n_facts").default == TRACE.n_facts


def test_settings_are_frozen_values():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SAMPLER.steps = 3
    assert dataclasses.replace(SAMPLER, steps=64).steps == 64 and SAMPLER.steps == 128
