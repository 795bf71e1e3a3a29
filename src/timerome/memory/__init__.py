"""Stage 3 of the paper: keys and deltas, the ridge memory, TopQ, and the inference-time edit memories."""
