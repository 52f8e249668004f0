"""ModelConfig: a Qwen3.5 text model's shapes, from a shipped YAML or a Hugging Face config.json.

Every size the model, the pools and `resident info` use comes from here; nothing elsewhere assumes
the real models' head dims or head counts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"
_LAYER_TYPES = (FULL_ATTENTION, LINEAR_ATTENTION)
_HF_MODEL_TYPES = ("qwen3_5_text", "qwen3_5")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and weights source of one Qwen3.5 text model.

    `weights` is "random" (seeded from `seed`) or the path of a Hugging Face checkpoint directory.
    """

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 262144
    full_attention_interval: int = 4
    layer_types: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    weights: str = "random"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.layer_types:
            if self.full_attention_interval < 1:
                raise ValueError(
                    f"full_attention_interval must be >= 1, got {self.full_attention_interval}"
                )
            types = tuple(
                FULL_ATTENTION if (i + 1) % self.full_attention_interval == 0 else LINEAR_ATTENTION
                for i in range(self.num_hidden_layers)
            )
            object.__setattr__(self, "layer_types", types)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        self._validate()

    def _validate(self) -> None:
        for field in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim", "max_position_embeddings",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model config {self.name!r}: {field} must be a positive int, "
                                 f"got {value!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"model config {self.name!r}: layer_types has "
                             f"{len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        bad = [t for t in self.layer_types if t not in _LAYER_TYPES]
        if bad:
            raise ValueError(f"model config {self.name!r}: unknown layer type {bad[0]!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"model config {self.name!r}: num_attention_heads "
                             f"{self.num_attention_heads} is not a multiple of num_key_value_heads "
                             f"{self.num_key_value_heads}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"model config {self.name!r}: linear_num_value_heads "
                             f"{self.linear_num_value_heads} is not a multiple of "
                             f"linear_num_key_heads {self.linear_num_key_heads}")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(f"model config {self.name!r}: partial_rotary_factor must be in "
                             f"(0, 1], got {self.partial_rotary_factor}")
        if self.rotary_dim % 2 or self.rotary_dim < 2:
            raise ValueError(f"model config {self.name!r}: rotary dims "
                             f"(partial_rotary_factor * head_dim = {self.rotary_dim}) must be even")
        if self.weights != "random" and not Path(self.weights).is_dir():
            raise ValueError(f"model config {self.name!r}: weights must be 'random' or a "
                             f"checkpoint directory, got {self.weights!r}")

    # -- derived shapes ---------------------------------------------------------------------

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN depthwise conv: q, k and v projections side by side."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def decode_projections(self) -> dict[str, tuple[int, int]]:
        """(N, K) of each fused projection a decode step runs, lm_head aside: the shapes
        bench_gemv times and a gemv table holds."""
        hidden = self.hidden_size
        q_dim = self.num_attention_heads * self.head_dim
        kv_dim = self.num_key_value_heads * self.head_dim
        return {
            "gdn in_proj": (self.conv_dim + self.linear_value_dim
                            + 2 * self.linear_num_value_heads, hidden),
            "gdn out_proj": (hidden, self.linear_value_dim),
            "attn qkv": (2 * q_dim + 2 * kv_dim, hidden),
            "attn o_proj": (hidden, q_dim),
            "mlp gate_up": (2 * self.intermediate_size, hidden),
            "mlp down": (hidden, self.intermediate_size),
        }

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with fields changed; a new layer count re-derives the layer pattern."""
        if "layer_types" not in changes and (
            {"num_hidden_layers", "full_attention_interval"} & set(changes)
        ):
            changes["layer_types"] = ()
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["layer_types"] = list(self.layer_types)
        data["eos_token_ids"] = list(self.eos_token_ids)
        return data


# -- loading --------------------------------------------------------------------------------


def configs_dir() -> Path:
    """Shipped configs: `configs/` beside the package in a source tree, else the wheel's copy."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package.parent / "configs", package / "_configs"):
        if (candidate / "models").is_dir():
            return candidate
    raise FileNotFoundError(f"no configs/models directory beside {package}")


def shipped_model_names() -> list[str]:
    return sorted(p.stem for p in (configs_dir() / "models").glob("*.yaml"))


def load_model_config(model: str) -> ModelConfig:
    """Resolves a model name: a shipped config stem, a YAML path, or a Hugging Face directory."""
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {model!r} has no config.json")
        return from_hf_dir(path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return from_yaml(path)
    shipped = configs_dir() / "models" / f"{model}.yaml"
    if shipped.is_file():
        return from_yaml(shipped)
    raise ValueError(f"unknown model {model!r}: not a checkpoint directory, a YAML file, "
                     f"or one of {', '.join(shipped_model_names())}")


def from_yaml(path: Path) -> ModelConfig:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of model fields")
    data.pop("engine", None)  # engine knob defaults for this model; EngineConfig reads them
    data.setdefault("name", path.stem)
    return _from_mapping(data, source=str(path))


def _from_mapping(data: dict[str, Any], source: str) -> ModelConfig:
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"{source}: unknown model field {unknown[0]!r}")
    for key in ("layer_types", "eos_token_ids"):
        if key in data:
            data[key] = tuple(data[key])
    try:
        return ModelConfig(**data)
    except TypeError as err:
        raise ValueError(f"{source}: {err}") from None


def from_hf_dir(path: Path) -> ModelConfig:
    """Reads config.json of a `qwen3_5_text` checkpoint, or the `text_config` of a `qwen3_5` one."""
    raw = json.loads((path / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type not in _HF_MODEL_TYPES:
        raise ValueError(f"{path}/config.json: model_type {model_type!r} is not one of "
                         f"{', '.join(_HF_MODEL_TYPES)}")
    text = raw.get("text_config", raw) if model_type == "qwen3_5" else raw
    tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    eos = text.get("eos_token_id", raw.get("eos_token_id"))
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    data = {
        "name": path.name,
        "vocab_size": text["vocab_size"],
        "hidden_size": text["hidden_size"],
        "intermediate_size": text["intermediate_size"],
        "num_hidden_layers": text["num_hidden_layers"],
        "num_attention_heads": text["num_attention_heads"],
        "num_key_value_heads": text["num_key_value_heads"],
        "head_dim": head_dim,
        "linear_num_key_heads": text["linear_num_key_heads"],
        "linear_num_value_heads": text["linear_num_value_heads"],
        "linear_key_head_dim": text["linear_key_head_dim"],
        "linear_value_head_dim": text["linear_value_head_dim"],
        "linear_conv_kernel_dim": text.get("linear_conv_kernel_dim", 4),
        "rope_theta": float(rope.get("rope_theta", text.get("rope_theta", 1e7))),
        "partial_rotary_factor": float(
            rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
        ),
        "rms_norm_eps": text.get("rms_norm_eps", 1e-6),
        "tie_word_embeddings": bool(tie),
        "max_position_embeddings": text.get("max_position_embeddings", 262144),
        "layer_types": tuple(text.get("layer_types") or ()),
        "full_attention_interval": text.get("full_attention_interval", 4),
        "eos_token_ids": eos_ids,
        "weights": str(path),
    }
    return _from_mapping(data, source=f"{path}/config.json")
