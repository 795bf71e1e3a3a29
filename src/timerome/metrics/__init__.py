"""The paper's metrics, one file per benchmark family (each defined once, in nats where a log-probability)."""

from timerome.engine.likelihood import answer_logprobs
from timerome.metrics.tofu import (forget_quality, forget_truth_ratio, harmonic_mean, normalised_prob,
                                   retain_truth_ratio, rouge_l_recall, truth_ratio)

__all__ = ["answer_logprobs", "forget_quality", "forget_truth_ratio", "harmonic_mean", "normalised_prob",
           "retain_truth_ratio", "rouge_l_recall", "truth_ratio"]
