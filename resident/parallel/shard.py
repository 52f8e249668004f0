"""Which slice of each weight a rank owns, and the all-reduce after the row-parallel projections.

The Megatron split: the projections that open a block (attention q/k/v, the GDN in-projections,
MLP gate/up) are column-parallel, split by output heads (by intermediate channels for the MLP);
the ones that close it (o_proj, GDN out_proj, down_proj) are row-parallel, split by the same
heads along their input, so each rank's output is a partial sum that one all-reduce completes.
A rank owns whole heads: a head's query, key, value and gates, its GDN conv channels, A_log and
dt_bias, its KV cache and its GDN state, so attention and the recurrence never communicate.
Embeddings, lm_head and the norms are replicated.

A rank's model is the ordinary model built from `rank_model_config` (every head count and the
intermediate size divided by the ranks), so its layers, cache and kernels need no change; the
weights come from the whole model's tensors (a checkpoint's, or the seeded random ones drawn at
the whole shape, so every rank count serves the same model), sliced here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from resident.model.config import ModelConfig
from resident.model.ops import ModelOps


@dataclass(frozen=True)
class SplitRule:
    """A parameter split along `dim`, which is a concatenation of segments, each of `units`
    equal blocks (heads, or channels for the MLP); a rank takes its share of every segment.
    Segments matter where one weight stacks several head groups: the GDN qkv projection (and
    its conv) is [query heads, key heads, value heads], each split apart."""

    dim: int
    units: tuple[int, ...]


def split_rules(model: ModelConfig) -> dict[str, SplitRule]:
    """Name suffix -> rule, for the whole model's shapes. q_proj interleaves each head's query
    and gate ([H, 2D] rows, as Attention.forward views it), so splitting it by heads keeps the
    pairs together."""
    heads, kv = model.num_attention_heads, model.num_key_value_heads
    k_heads, v_heads = model.linear_num_key_heads, model.linear_num_value_heads
    qkv = (k_heads, k_heads, v_heads)
    column = {"self_attn.q_proj.weight": (heads,), "self_attn.k_proj.weight": (kv,),
              "self_attn.v_proj.weight": (kv,), "linear_attn.in_proj_qkv.weight": qkv,
              "linear_attn.conv1d.weight": qkv, "linear_attn.in_proj_z.weight": (v_heads,),
              "linear_attn.in_proj_b.weight": (v_heads,),
              "linear_attn.in_proj_a.weight": (v_heads,), "linear_attn.A_log": (v_heads,),
              "linear_attn.dt_bias": (v_heads,),
              "mlp.gate_proj.weight": (model.intermediate_size,),
              "mlp.up_proj.weight": (model.intermediate_size,)}
    row = {"self_attn.o_proj.weight": (heads,), "linear_attn.out_proj.weight": (v_heads,),
           "mlp.down_proj.weight": (model.intermediate_size,)}
    return {**{name: SplitRule(0, units) for name, units in column.items()},
            **{name: SplitRule(1, units) for name, units in row.items()}}


def rank_model_config(model: ModelConfig, ranks: int) -> ModelConfig:
    """The shapes one rank's model has: its share of every split dimension."""
    if ranks == 1:
        return model
    return model.replace(
        num_attention_heads=model.num_attention_heads // ranks,
        num_key_value_heads=model.num_key_value_heads // ranks,
        linear_num_key_heads=model.linear_num_key_heads // ranks,
        linear_num_value_heads=model.linear_num_value_heads // ranks,
        intermediate_size=model.intermediate_size // ranks)


@dataclass(frozen=True)
class RankShard:
    """One rank's share of a model's weights."""

    rank: int = 0
    ranks: int = 1

    def model_config(self, model: ModelConfig) -> ModelConfig:
        return rank_model_config(model, self.ranks)

    def full_shape(self, name: str, shape: torch.Size, model: ModelConfig) -> torch.Size:
        """The whole model's shape of the parameter this rank holds at `shape`."""
        rule = _rule(name, model)
        if rule is None or self.ranks == 1:
            return shape
        whole = list(shape)
        whole[rule.dim] *= self.ranks
        return torch.Size(whole)

    def take(self, name: str, whole: torch.Tensor, model: ModelConfig) -> torch.Tensor:
        """This rank's slice of the whole tensor `whole` of parameter `name`."""
        rule = _rule(name, model)
        if rule is None or self.ranks == 1:
            return whole
        rows_per_unit = whole.shape[rule.dim] // sum(rule.units)
        pieces, start = [], 0
        for units in rule.units:
            share = units // self.ranks * rows_per_unit
            pieces.append(whole.narrow(rule.dim, start + self.rank * share, share))
            start += units * rows_per_unit
        return torch.cat(pieces, dim=rule.dim)


    def locate(self, name: str, whole_shape: torch.Size, model: ModelConfig,
               flat: int) -> tuple[int, int]:
        """(the rank that holds element `flat` of the whole tensor, in row-major order; its
        row-major index in that rank's slice): the inverse of `take`, for single elements.
        Rank 0 answers for a replicated tensor's elements."""
        rule = _rule(name, model)
        if rule is None or self.ranks == 1:
            return 0, flat
        coords = list(_unravel(flat, whole_shape))
        rows_per_unit = whole_shape[rule.dim] // sum(rule.units)
        start, kept = 0, 0  # kept: the rank's rows of the segments before this one
        for units in rule.units:
            size, share = units * rows_per_unit, units // self.ranks * rows_per_unit
            offset = coords[rule.dim] - start
            if offset < size:
                coords[rule.dim] = kept + offset % share
                local = list(whole_shape)
                local[rule.dim] //= self.ranks
                return offset // share, _ravel(coords, local)
            start, kept = start + size, kept + share
        raise IndexError(f"{name}: element {flat} is outside {tuple(whole_shape)}")


def _unravel(flat: int, shape: torch.Size) -> list[int]:
    coords = []
    for size in reversed(shape):
        coords.append(flat % size)
        flat //= size
    return coords[::-1]


def _ravel(coords: list[int], shape: list[int]) -> int:
    flat = 0
    for coord, size in zip(coords, shape, strict=True):
        flat = flat * size + coord
    return flat


def _rule(name: str, model: ModelConfig) -> SplitRule | None:
    for suffix, rule in split_rules(model).items():
        if name.endswith(suffix):
            return rule
    return None


# the ModelOps fields whose output is a row-parallel projection's (or its split-K partials,
# which add up the same way): each rank's is a partial sum over its heads
ROW_PARALLEL_OPS = ("narrow_linear", "silu_mul_linear", "gated_norm_linear",
                    "sigmoid_gate_linear")


def row_parallel_ops(ops: ModelOps, all_reduce: Callable[[torch.Tensor], None]) -> ModelOps:
    """`ops` with an in-place all-reduce after every row-parallel projection: the one
    collective of each attention/GDN block and each MLP. The wrapped ops keep their
    signatures, so the model code is the same at every rank count."""
    # the sum of ranks comes before the next add + norm, so no projection may run it
    changes = {"narrow_linear_add_norm": None, "silu_mul_linear_add_norm": None}
    for name in ROW_PARALLEL_OPS:
        op = getattr(ops, name)
        if op is not None:
            changes[name] = _reduced(op, all_reduce)
    return dataclasses.replace(ops, **changes)


def _reduced(op: Callable, all_reduce: Callable[[torch.Tensor], None]) -> Callable:
    def call(*args):
        out = op(*args)
        all_reduce(out)
        return out
    return call
