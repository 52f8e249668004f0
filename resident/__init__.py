"""resident: a Qwen3.5 serving engine whose decode planning lives on the GPU."""

__version__ = "0.1.0"
