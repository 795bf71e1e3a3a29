"""Stages 1 and 2 of the paper: diffusion-time causal tracing (TIE) and coordinate selection."""
