"""Random weights are reproducible across processes; checkpoint loading names what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from resident.config import EngineConfig
from resident.model.config import load_model_config
from resident.model.weights import WeightsError, load_model, torch_dtype, weights_fingerprint

from model_driver import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]

_DIGEST = """
import hashlib, json, sys, torch
from resident.model.config import load_model_config
from resident.model.weights import load_model, weights_fingerprint
config = load_model_config("tiny").replace(seed=int(sys.argv[1]))
model = load_model(config, "cpu", torch.float32)
digest = hashlib.sha256()
for name, param in sorted(model.named_parameters()):
    digest.update(name.encode()); digest.update(param.detach().numpy().tobytes())
print(json.dumps({"fingerprint": weights_fingerprint(model), "bytes": digest.hexdigest()}))
"""


def _digests_in_subprocesses(*seeds: int) -> list[dict]:
    """The digest for each seed, each in a process of its own, the processes run at once."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = [subprocess.Popen([sys.executable, "-c", _DIGEST, str(seed)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for seed in seeds]
    digests = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=300)
            assert process.returncode == 0, err
            digests.append(json.loads(out))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return digests


def test_same_seed_same_weights_in_two_processes():
    first, second, other = _digests_in_subprocesses(7, 7, 8)
    assert first == second
    assert other["fingerprint"] != first["fingerprint"]
    assert other["bytes"] != first["bytes"]


_BUILD = """
import sys
from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.model.config import load_model_config
build_engine(load_model_config("tiny"), EngineConfig(), "cpu")
print(",".join(m for m in ("torch._dynamo", "sympy", "triton") if m in sys.modules))
"""


def test_a_cpu_engine_builds_without_the_compiler_stack():
    """Building the model on the meta device and materialising it must not run torch's Python
    decompositions (an embedding's normal_ init, arithmetic on meta tensors, empty_like): they
    import torch._dynamo and sympy, ~2 s of a tiny CPU server's ~4 s start. With torch.compile
    off nothing else needs them. Nor triton: a CPU install (`pip install -e .`) has none."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    built = subprocess.run([sys.executable, "-c", _BUILD], env=env, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == ""


def test_fingerprint_sees_a_changed_value():
    model = load_model(load_model_config("tiny"), "cpu", torch.float32)
    before = weights_fingerprint(model)
    with torch.no_grad():
        model.model.norm.weight[0] += 1.0  # index 0 is always sampled
    assert weights_fingerprint(model) != before


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    """tiny's random weights written as a transformers-style checkpoint."""
    directory = tmp_path_factory.mktemp("tiny_ckpt")
    return directory, save_tiny_checkpoint(directory)


def test_loads_a_multimodal_style_checkpoint(saved_tiny):
    directory, fingerprint = saved_tiny
    config = load_model_config(str(directory))
    assert config.name == directory.name and config.eos_token_ids == (511,)
    assert weights_fingerprint(load_model(config, "cpu", torch.float32)) == fingerprint


def _broken_copy(source: Path, target: Path, edit) -> Path:
    target.mkdir()
    (target / "config.json").write_text((source / "config.json").read_text())
    tensors = load_file(str(source / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(target / "model.safetensors"))
    return target


NAME = "model.language_model.layers.1.linear_attn.in_proj_z.weight"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.pop(NAME), "missing tensor 'model.layers.1.linear_attn.in_proj_z.weight'"),
        (lambda t: t.__setitem__(NAME.replace("in_proj_z", "in_proj_zz"), t.pop(NAME)),
         "unexpected tensor 'model.language_model.layers.1.linear_attn.in_proj_zz.weight'"),
        (lambda t: t.__setitem__(NAME, t[NAME][:, :-1].contiguous()),
         f"tensor '{NAME}' has shape (64, 63), the model expects (64, 64)"),
    ],
    ids=["removed", "renamed", "reshaped"],
)
def test_loader_errors_name_the_tensor(saved_tiny, tmp_path, edit, message):
    directory = _broken_copy(saved_tiny[0], tmp_path / "broken", edit)
    with pytest.raises(WeightsError) as caught:
        load_model(load_model_config(str(directory)), "cpu", torch.float32)
    assert message in str(caught.value)


def test_mtp_and_vision_tensors_are_skipped(saved_tiny, tmp_path):
    def add_extras(tensors):
        tensors["mtp.fc.weight"] = torch.zeros(2, 2)
        tensors["model.visual.patch_embed.weight"] = torch.zeros(2, 2)

    directory = _broken_copy(saved_tiny[0], tmp_path / "extras", add_extras)
    model = load_model(load_model_config(str(directory)), "cpu", torch.float32)
    assert weights_fingerprint(model) == saved_tiny[1]


def test_dtype_resolution():
    tiny = load_model_config("tiny")

    def resolved(dtype: str, device: str) -> torch.dtype:
        return torch_dtype(EngineConfig(dtype=dtype).resolve(tiny, device).dtype)

    assert resolved("auto", "cpu") == torch.float32
    assert resolved("auto", "cuda") == torch.bfloat16
    assert resolved("float64", "cpu") == torch.float64
    with pytest.raises(ValueError, match="float64 is for exact tests on CPU"):
        resolved("float64", "cuda")
    with pytest.raises(ValueError, match="'int8' is not one of"):
        EngineConfig(dtype="int8")
    with pytest.raises(ValueError, match="'int8' is not one of"):
        torch_dtype("int8")
