"""The suite's environment, set once where it starts, so that no test file depends on another
having run first.

Without CUDA the Triton kernels run in the interpreter. TRITON_INTERPRET must be set before
triton is first imported (triton's own helpers, tl.cdiv and the like, are JIT functions made at
its import, and a kernel interpreted later cannot call them), and pytest imports this file before
any test module. On a CUDA host it stays unset, so the GPU tests compile their kernels; a
TRITON_INTERPRET given by the caller is kept either way. A subprocess that must compile (the
sm_90 compile check) removes it from its own environment.

One torch thread in the test process unless OMP_NUM_THREADS says otherwise: the tiny model's
ops take microseconds, and with a second thread on a busy 2-CPU host each op that goes parallel
(bmm, softmax, advanced indexing) waits a scheduler slice, milliseconds, for it
(tests/test_engine.py: 59 s on 2 threads, 7 s on 1). The servers the tests start choose their
own (resident/server/core.py torch_threads).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
