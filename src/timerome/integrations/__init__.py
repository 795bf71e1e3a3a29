"""Other tools driving timerome: the lm-evaluation-harness model."""
