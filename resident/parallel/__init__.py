"""Tensor parallelism (knob `tensor_parallel`, docs/parallel.md): the weights a rank owns
(shard.py), the process group its ranks share (group.py) and the per-step check that they run
the same steps (lockstep.py)."""
