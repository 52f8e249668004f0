"""Weights: a Hugging Face checkpoint directory, or seeded random weights for a named config.

Random weights are drawn tensor by tensor on the target device from a generator seeded with
(config seed, tensor name), so the same seed gives bit-identical weights in every process on the
same device type, whatever the order tensors are built in. The fingerprint (names, shapes, dtypes
and a sample of values) lets two servers prove they serve the same model.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from resident.model.config import ModelConfig
from resident.model.dense import DenseOps
from resident.model.ops import ModelOps
from resident.model.qwen3_5 import Qwen3_5ForCausalLM
from resident.parallel.shard import RankShard

# Tensors a Qwen3.5 checkpoint carries that a text-only server does not use.
_IGNORED = re.compile(r"^(mtp\.|model\.visual\.|visual\.)")
_PREFIXES = ("model.language_model.", "model.")
_FINGERPRINT_SAMPLES = 16


class WeightsError(ValueError):
    """A checkpoint that does not fit the model: names the tensor."""


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           "float64": torch.float64}


def torch_dtype(name: str) -> torch.dtype:
    """A resolved dtype knob (config.py) as a torch dtype."""
    if name not in _DTYPES:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def load_model(
    config: ModelConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    ops: ModelOps | None = None,
    dense: DenseOps | None = None,
    shard: RankShard | None = None,
) -> Qwen3_5ForCausalLM:
    """Builds the model on `device` without a throwaway init, fills every parameter, then
    fuses the projections. `shard`: a tensor-parallel rank's model, its slices of the whole
    model's weights (parallel/shard.py)."""
    shard = shard or RankShard()
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(shard.model_config(config), ops, dense).to(dtype)
    _materialise(model, torch.device(device))
    model.init_buffers()
    params = {name: _Slot(param, shard, config) for name, param in model.named_parameters()}
    if config.weights == "random":
        _fill_random(params, config.seed)
    else:
        _fill_from_checkpoint(params, Path(config.weights), config.tie_word_embeddings)
    model.requires_grad_(False)
    model.fuse_projections()
    return model.eval()


def _materialise(model: torch.nn.Module, device: torch.device) -> None:
    """`Module.to_empty`, without its `torch.empty_like` of meta tensors: that runs a Python
    decomposition which imports sympy (~0.4 s of a CPU server's start). Each module's tensors
    are replaced one by one, so a parameter shared by two modules would come out as two; the
    model shares none (tied embeddings are read from embed_tokens: `output_weight`)."""
    for module in model.modules():
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, meta in tensors:
            empty = torch.empty(meta.shape, dtype=meta.dtype, device=device)
            if isinstance(meta, torch.nn.Parameter):
                empty = torch.nn.Parameter(empty, requires_grad=meta.requires_grad)
            setattr(module, name, empty)


class _Slot:
    """A parameter to fill from the whole model's tensor of its name: its shape there, and the
    copy of this rank's slice of it."""

    def __init__(self, param: torch.nn.Parameter, shard: RankShard, config: ModelConfig) -> None:
        self.param, self.shard, self.config = param, shard, config

    def whole_shape(self, name: str) -> torch.Size:
        return self.shard.full_shape(name, self.param.shape, self.config)

    def fill(self, name: str, whole: torch.Tensor) -> None:
        self.param.data.copy_(self.shard.take(name, whole, self.config))


# -- random ---------------------------------------------------------------------------------


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _random_values(name: str, shape: torch.Size, generator: torch.Generator,
                   device: torch.device) -> torch.Tensor:
    """Draws in fp32. Norm weights, A_log and dt_bias sit away from their trivial init so every
    code path they feed is exercised."""
    def normal(std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=device) * std + mean

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.rand(shape, generator=generator, device=device) * (high - low) + low

    if name.endswith("linear_attn.norm.weight"):
        return normal(0.1, mean=1.0)
    if name.endswith("norm.weight"):  # zero-centred: the scale is 1 + w
        return normal(0.1)
    if name.endswith("A_log"):
        return uniform(1.0, 16.0).log()
    if name.endswith("dt_bias"):
        return normal(0.1, mean=1.0)
    if name.endswith("conv1d.weight"):
        bound = shape[-1] ** -0.5
        return uniform(-bound, bound)
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        return normal(0.02)
    # projections at 1/sqrt(fan_in): each layer then moves the residual stream, so greedy
    # tokens depend on the context (at 0.02 a tied model echoes its input token)
    return normal(shape[-1] ** -0.5)


def _fill_random(params: dict[str, _Slot], seed: int) -> None:
    """Each tensor drawn at the whole model's shape, whatever the rank's share: every rank
    count serves the same weights."""
    for name, slot in params.items():
        device = slot.param.device
        generator = torch.Generator(device=device).manual_seed(_tensor_seed(seed, name))
        slot.fill(name, _random_values(name, slot.whole_shape(name), generator, device))


# -- checkpoint -----------------------------------------------------------------------------


def _checkpoint_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / shard for shard in shards]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{directory}: no *.safetensors files")
    return files


def _our_name(checkpoint_name: str) -> str | None:
    """Maps a checkpoint tensor name to ours (`model.X`, `lm_head.weight`); None to skip it."""
    if _IGNORED.match(checkpoint_name):
        return None
    if checkpoint_name.startswith("lm_head."):
        return checkpoint_name
    for prefix in _PREFIXES:
        if checkpoint_name.startswith(prefix):
            return "model." + checkpoint_name[len(prefix):]
    return "model." + checkpoint_name


def _fill_from_checkpoint(params: dict[str, _Slot], directory: Path, tied: bool) -> None:
    loaded: set[str] = set()
    for path in _checkpoint_files(directory):
        with safe_open(str(path), framework="pt", device="cpu") as shard:
            for checkpoint_name in shard.keys():  # noqa: SIM118 (safe_open is not a dict)
                name = _our_name(checkpoint_name)
                if name is None or (tied and name == "lm_head.weight"):
                    continue
                if name not in params:
                    raise WeightsError(f"{path.name}: unexpected tensor {checkpoint_name!r}")
                tensor = shard.get_tensor(checkpoint_name)
                slot = params[name]
                expected = tuple(slot.whole_shape(name))
                if tuple(tensor.shape) != expected:
                    raise WeightsError(
                        f"{path.name}: tensor {checkpoint_name!r} has shape {tuple(tensor.shape)}, "
                        f"the model expects {expected}"
                    )
                slot.fill(name, tensor.to(device=slot.param.device, dtype=slot.param.dtype))
                loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise WeightsError(f"{directory}: missing tensor {missing[0]!r}"
                           + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))


# -- fingerprint ----------------------------------------------------------------------------


def weights_fingerprint(model: torch.nn.Module, shard: RankShard | None = None,
                        whole: ModelConfig | None = None, all_reduce=None) -> str:
    """16 hex digits over every parameter's name, shape, dtype and evenly spaced values.
    A tensor-parallel rank (`shard` of the `whole` model, its group's in-place `all_reduce`)
    gives the whole model's fingerprint: the shapes are the whole tensors', and each sampled
    element comes from the rank that holds it (the others add zero), so every rank count
    serving the same weights fingerprints alike (the gate compares arms by it)."""
    shard = shard or RankShard()
    digest = hashlib.sha256()
    samples = []
    for name, param in sorted(model.named_parameters()):
        shape = shard.full_shape(name, param.shape, whole) if whole else param.shape
        digest.update(f"{name}:{tuple(shape)}:{param.dtype};".encode())
        samples.append(_samples(name, param, shape, shard, whole))
    values = torch.cat(samples)
    if all_reduce is not None:
        all_reduce(values)
    digest.update(values.cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _samples(name: str, param: torch.Tensor, shape: torch.Size, shard: RankShard,
             whole: ModelConfig | None) -> torch.Tensor:
    """The evenly spaced elements of the whole tensor this rank holds, zero where another
    rank holds them."""
    flat = param.detach().reshape(-1)
    # exact integer spacing: float32 linspace overshoots the last index of large tensors
    numel = shape.numel()
    wanted = [step * (numel - 1) // (_FINGERPRINT_SAMPLES - 1)
              for step in range(_FINGERPRINT_SAMPLES)]
    if whole is None or shard.ranks == 1:
        return flat[torch.tensor(wanted, device=flat.device)].double()
    out = torch.zeros(_FINGERPRINT_SAMPLES, dtype=torch.float64, device=flat.device)
    for i, index in enumerate(wanted):
        rank, local = shard.locate(name, shape, whole, index)
        if rank == shard.rank:
            out[i] = flat[local].double()
    return out
