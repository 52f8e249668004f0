"""Kernels behind the model's ops. Each op has a torch reference (CPU, tests, eager fallback);
faster implementations take the same signature."""
