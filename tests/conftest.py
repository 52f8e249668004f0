import os

import pytest
import torch

# One torch thread in the test process unless OMP_NUM_THREADS says otherwise: the tiny model's
# ops take microseconds, and with a second thread on a busy 2-CPU host each op that goes
# parallel (bmm, softmax, advanced indexing) waits a scheduler slice, milliseconds, for it
# (tests/test_engine.py: 59 s on 2 threads, 7 s on 1). The servers the tests start choose their
# own (resident/server/core.py torch_threads).
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
