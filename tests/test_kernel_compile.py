"""Every Triton kernel a small decode bucket launches compiles for the H200 (sm_90) with shared
memory to spare and no register spills: Triton's compiler and ptxas, no GPU needed. The
interpreter tests check the numbers; this catches what only the GPU compiler sees (450 KB of
shared memory once, and a fused prologue that spilled 7 KB a thread)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")


def _has_cuda_backend() -> bool:
    from triton.backends import backends

    return "nvidia" in backends


@pytest.mark.skipif(not _has_cuda_backend(), reason="triton has no CUDA backend here")
@pytest.mark.parametrize("model", ["qwen3.5-0.8b", "qwen3.5-9b"])
def test_decode_kernels_compile_for_hopper(model):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "resident.tools.compile_check", "--model", model, "--arch", "90"],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) >= 6 and all(line.startswith("  ok ") for line in lines), result.stdout


def test_every_launched_kernel_is_found_for_its_resources():
    """compiled_kernels (bench.py's record of what the driver loaded) finds each kernel of
    resident/kernels/ by module: plain JIT functions and the autotuned chunk-states kernel; a
    helper another module imports is named by its own module once. Compiled (not interpreted)
    functions only: in a subprocess without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = ("from resident.tools.compiled_kernels import compiled_kernels, jit_functions\n"
              "print(sorted(jit_functions()))\nprint(compiled_kernels())")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    names, compiled = result.stdout.splitlines()
    for kernel in ("decode_attention._split_kernel", "gemv._gemv_kernel",
                   "chunk_states._chunk_states_kernel", "nucleus_race._round_kernel",
                   "gdn_layer_decode._gdn_layer_decode_kernel", "gumbel_race._gumbel"):
        assert f"'{kernel}'" in names, kernel
    assert "nucleus_race._gumbel" not in names  # imported from gumbel_race
    assert compiled == "[]"  # nothing was launched here
