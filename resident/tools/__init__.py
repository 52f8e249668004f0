"""Developer tools run with python -m: benches of the step, the host and the kernels, and a
GPU-less compile check of the Triton kernels. Nothing in the engine imports them."""
