"""The engine core: requests, scheduling, the step runner and the sampler."""
