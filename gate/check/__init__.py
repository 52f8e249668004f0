"""`resident-gate check`: greedy-token and row-check sweeps, judged and reported."""
