"""Typed settings with one default each: the sampler, the likelihood, the trace, the edit and locality.

Every signature, CLI option and experiment CONFIG that takes one of these reads its default from
here (SAMPLER.steps, LIKELIHOOD.n_mc, TRACE.steps, EDIT.alpha, ...), so a default is written once;
tests/test_architecture.py fails on a default literal of one of these names elsewhere. The `timerome`
method's DEFAULTS (methods/timerome_edit.py) and EditMemory's signature read EDIT; the codebook and
rewrite memories have their own alpha (codebook_memory.DEFAULT_ALPHA, rewrite_memory.DEFAULT_ALPHA).

    from timerome.engine.settings import LIKELIHOOD, SAMPLER, TRACE
    generate(bb, prompt, steps=SAMPLER.steps)        # LLaDA's reference: 128 steps for 128 tokens
    ANSWER.gen_length                                # the CLI's `generate`: 32 tokens in 32 steps
    QUICK_LIKELIHOOD.n_mc, SMALL_LOCALITY.n_retain   # the named smaller settings: --quick, repeated probes
    dataclasses.replace(SAMPLER, steps=64)           # a settings object of one's own
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplerSettings:
    """Denoising generation (sampler.generate; LLaDA's generate.py defaults)."""

    steps: int = 128            # denoising steps over the whole answer
    gen_length: int = 128       # answer tokens (masks) to fill
    block_length: int = 128     # semi-autoregressive blocks (= gen_length: one block)
    temperature: float = 0.0    # Gumbel noise on the logits (0: greedy)
    cfg_scale: float = 0.0      # classifier-free guidance (0: off)
    remasking: str = "low_confidence"


@dataclass(frozen=True)
class LikelihoodSettings:
    """The MDLM's Monte-Carlo answer log-likelihood (likelihood.log_likelihood_batch)."""

    n_mc: int = 16              # masked copies per answer (the estimator's samples)
    # every masked-answer draw's t ~ U(eps, 1) (engine.encoding.mask_answers: LLaDA's training floor on the mask
    # rate), in the training loss and the methods' masked objectives as well
    eps: float = 1e-3


@dataclass(frozen=True)
class TraceSettings:
    """Diffusion-time causal tracing (tracing.causal_trace.trace) and the trajectories it reads."""

    steps: int = 8              # denoising steps K of each traced trajectory
    n_samples: int = 5          # noise draws per fact (the corrupted runs)
    n_facts: int = 8            # facts traced (the paper's validation set)
    tau: float = 1.0            # decay of the TIE aggregation's weights exp(-tau (k' - k)) (Eq. tie_agg)
    readout: str = "decided"    # how log p(object | x_k) scores committed positions (tracing/tie.py: READOUTS)
    batch_size: int = 256       # most rows per forward (a memory knob: the numbers do not depend on it)
    noise: str = "in_order"     # how the noise is drawn (tracing/tie.py: NOISE_DRAWS)
    read_positions: str = "all"  # which answer positions log p(object | x_k) sums (tracing/tie.py: READ_POSITIONS)
    beta: float = 0.0           # the selection's neighbour penalty (Eq. coord; 0: the largest mean |TIE| alone)


@dataclass(frozen=True)
class EditSettings:
    """The paper's edit memory (memory/edit_memory.EditMemory, the `timerome` method), as this toolkit
    runs it by default (README, "Operating point"; the paper's grid is the method's CANONICAL rows)."""

    alpha: float = 1.5          # strength: embedded default, relative lam 8: forget01 LP -56.6 nats for -0.69 retain
    lam: float = 8.0            # relative ridge lambda: 8 x the mean squared key norm (memory/ridge.py)
    q: int = 0                  # TopQ: 0 = dense (every fact)
    key_metric: str = "whitened"  # the selectivity benchmark's winner on the embedded model
    target: str = "I don't know."  # what an edited model should say instead (the paper's t)


@dataclass(frozen=True)
class LocalitySettings:
    """How many rows of a TOFU-schema source probe locality (metrics/editing.locality_rows): the API,
    `timerome eval` (--n-retain, --n-world) and the editing experiments."""

    n_retain: int = 40          # retain rows
    n_world: int = 20           # real-author rows, and as many world-fact rows


SAMPLER = SamplerSettings()
# short answers: the CLI's `timerome generate` (the embedded model's answers are under 20 tokens; a
# quarter of the reference's forwards); `generate()`, `evaluate` and the experiments keep SAMPLER
ANSWER = SamplerSettings(steps=32, gen_length=32, block_length=32)
LIKELIHOOD = LikelihoodSettings()
# the experiments' --quick subsets and the demo's --quick: a quarter of the Monte-Carlo masks
QUICK_LIKELIHOOD = LikelihoodSettings(n_mc=4)
TRACE = TraceSettings()
EDIT = EditSettings()
LOCALITY = LocalitySettings()
# half the probes, where locality is measured many times over: the demo's sweep, robustness's extraction
# cells, the sequential experiment's retain rows at each of its steps
SMALL_LOCALITY = LocalitySettings(n_retain=20, n_world=10)
