"""The suite's environment, set once where it starts, so that no test file depends on another
having run first.

Without CUDA the Triton kernels run in the interpreter. TRITON_INTERPRET must be set before
triton is first imported (triton's own helpers, tl.cdiv and the like, are JIT functions made at
its import, and a kernel interpreted later cannot call them), and pytest imports this file before
any test module. On a CUDA host it stays unset, so the GPU tests compile their kernels; a
TRITON_INTERPRET given by the caller is kept either way. A subprocess that must compile (the
sm_90 compile check) removes it from its own environment.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
