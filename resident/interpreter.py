"""Whether Triton kernels run in Triton's interpreter: on CPU, for tests. Torch-free and
Triton-free, so the config (which the API process imports) and the kernels read one rule."""

from __future__ import annotations

import os


def triton_interpreting() -> bool:
    """TRITON_INTERPRET set to anything but empty or 0."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
