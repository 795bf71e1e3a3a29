"""Stage 4 of the paper: evaluation with or without an edit, statistics, counterfactual efficacy."""
