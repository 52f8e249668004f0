"""What the GPU compiler made of this process's Triton kernels: for each kernel of
resident/kernels/ that was compiled and loaded here, each specialization's warps, stages,
registers a thread, local (spill) bytes a thread and shared bytes, as the driver reports them.

compile_check.py compiles each kernel as typed, without the values a launch specializes on
(an int argument equal to 1 becomes a constant, ints that are multiples of 16 and 16-byte-aligned
pointers get a divisibility hint), so its registers are an upper bound: decode attention's split
pass reads 241 there at the 0.8B's shapes and 92 with the hints a launch there gives (strides
of 1 on the head dimension, aligned pointers). These are the launched kernels' own numbers
(bench.py writes them: `compiled_kernels`).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import triton

import resident.kernels


def jit_functions() -> dict[str, triton.runtime.JITFunction]:
    """Every @triton.jit function of resident/kernels/ (an autotuned one's function inside),
    by module.name."""
    found = {}
    for info in pkgutil.iter_modules(resident.kernels.__path__):
        module = importlib.import_module(f"resident.kernels.{info.name}")
        for function in vars(module).values():
            # an Autotuner or Heuristics holds the function as .fn, perhaps in another wrapper
            while isinstance(function, triton.runtime.KernelInterface) \
                    and not isinstance(function, triton.runtime.JITFunction):
                function = function.fn
            if isinstance(function, triton.runtime.JITFunction) \
                    and function.fn.__module__ == module.__name__:
                found.setdefault(f"{info.name}.{function.__name__}", function)
    return found


def compiled_kernels() -> list[dict[str, Any]]:
    """One entry a compiled and loaded specialization, sorted by kernel then registers:
    {kernel, warps, stages, registers, spill_bytes, shared_bytes}."""
    rows = []
    for name, function in jit_functions().items():
        for kernel_cache, *_ in function.device_caches.values():
            for compiled in kernel_cache.values():
                if getattr(compiled, "n_regs", None) is None:  # compiled, never loaded
                    continue
                rows.append({"kernel": name, "warps": compiled.metadata.num_warps,
                             "stages": compiled.metadata.num_stages,
                             "registers": compiled.n_regs, "spill_bytes": compiled.n_spills,
                             "shared_bytes": compiled.metadata.shared})
    return sorted(rows, key=lambda row: (row["kernel"], -row["registers"]))
