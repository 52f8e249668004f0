"""The dense elementwise parts of a layer, as plain functions Inductor can fuse.

Between the GEMMs and the custom kernels a layer is a chain of small elementwise ops (norms in
fp32, gates, RoPE, the MLP's silu). Eager, each op is a kernel launch; compiled, each function
below is one fused kernel. `build_dense_ops(compile=True)` wraps each in `torch.compile`; without
it they run eager with the same numerics (the CPU tests and parity checks use that form).

Numerics follow the reference: norms in fp32 (fp64 for an fp64 model), RoPE tables in fp32 cast
to the activation dtype, the GDN decay in fp32.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from resident.kernels import compute_dtype

log = logging.getLogger("resident.compile")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm over the last dim: norm(x) * (1 + w)."""
    xf = x.to(compute_dtype(x.dtype))
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.to(xf.dtype))).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): a layer's residual add fused into its norm.
    x is [T, H], or a split-K projection's fp32 partial sums [S, T, H], added up here (and
    rounded to the activation dtype, as a finished projection would be) so that no kernel of
    its own does it: as S pointwise adds, which Inductor puts in the norm's kernel (x.sum(0),
    a reduction over another dim than the norm's, took a kernel of its own)."""
    if x.dim() == 3:
        x = functools.reduce(operator.add, x.unbind(0)).to(residual.dtype)
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """GDN output norm over the last dim: w * norm(x) * silu(gate), w not zero-centred.
    x, gate: [T, Hv, Dv] (gate may be a strided view)."""
    compute = compute_dtype(x.dtype)
    xf = x.to(compute)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * normed.to(x.dtype)
    return (out * F.silu(gate.to(compute))).to(x.dtype)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor,
              dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_decay fp32, beta): g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)."""
    log_decay = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    return log_decay, b.sigmoid()


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] -> [T, I]: silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [T, rotary_dim], computed in fp32 like the reference."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Partial RoPE on the first rotary_dim dims of each head. x: [T, H, D], cos/sin: [T, R]."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    x_rot = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat([x_rot, x_pass], dim=-1)


def qk_norm_rope(query: torch.Tensor, key: torch.Tensor, q_weight: torch.Tensor,
                 k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm then partial RoPE of q [T, H, D] and k [T, Hkv, D]."""
    query = apply_rotary(rms_norm(query, q_weight, eps), cos, sin)
    key = apply_rotary(rms_norm(key, k_weight, eps), cos, sin)
    return query, key


def sigmoid_gate(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Gated attention's output gate: out * sigmoid(gate), both [T, H, D] (gate strided)."""
    return out * torch.sigmoid(gate)


@dataclass(frozen=True)
class DenseOps:
    """The dense functions a forward calls: plain or compiled."""

    rms_norm: Callable = rms_norm
    add_rms_norm: Callable = add_rms_norm
    gated_rms_norm: Callable = gated_rms_norm
    gdn_gates: Callable = gdn_gates
    silu_mul: Callable = silu_mul
    rope_tables: Callable = rope_tables
    qk_norm_rope: Callable = qk_norm_rope
    sigmoid_gate: Callable = sigmoid_gate


# The token dim of each function's positional tensor arguments (None: a weight, a table or
# not a tensor). add_rms_norm's x is [T, H] or a split-K projection's partials [S, T, H].
TOKEN_DIMS: dict[str, tuple[int | None, ...]] = {
    "rms_norm": (0,),
    "add_rms_norm": (-2, 0),
    "gated_rms_norm": (0, 0),
    "gdn_gates": (0, 0),
    "silu_mul": (0,),
    "rope_tables": (0,),
    "qk_norm_rope": (0, 0, None, None, 0, 0),
    "sigmoid_gate": (0, 0),
}


def build_dense_ops(compile: bool, pdl: bool = False) -> DenseOps:
    """Each function compiled on its own (fullgraph: nothing in them may break the graph),
    with only its tokens dim dynamic, from the first call.

    Dynamic from the first call: otherwise Inductor specialises the first token count it sees
    (say one prompt's length) and goes dynamic only at the second, so the same tokens would
    round differently depending on which step came first. Only the tokens dim: with every dim
    symbolic (`dynamic=True`) the feature dims became runtime values, so Inductor's kernels
    indexed by division (silu*mul of a 2,304-token step took 30 µs, 15.5 with static feature
    dims, for 10 µs of bytes), and a token count equal to a feature dim (256 rows, head_dim
    256) was duck-sized into one symbol, which the next bucket's count then broke: a
    recompile. A one-token batch is always its own graph, so each function compiles twice
    whatever the step mix.

    pdl: Inductor's kernels launched with programmatic dependent launch (its
    `triton.enable_pdl`, where this torch has it), so they chain with the decode kernels'
    (kernels/pdl.py).
    """
    plain = DenseOps()
    if not compile:
        return plain
    install_recompile_reporter()
    options = {"triton.enable_pdl": True} if pdl and inductor_has_pdl() else None
    return DenseOps(**{f.name: _compile_tokens_dynamic(getattr(plain, f.name), TOKEN_DIMS[f.name],
                                                       options)
                       for f in fields(DenseOps)})


def inductor_has_pdl() -> bool:
    """Whether this torch's Inductor can launch its kernels with PDL."""
    from torch._inductor import config

    return hasattr(config.triton, "enable_pdl")


def _compile_tokens_dynamic(function: Callable, token_dims: tuple[int | None, ...],
                            options: dict | None = None) -> Callable:
    compiled = torch.compile(function, fullgraph=True, options=options)

    @functools.wraps(function)
    def call(*args):
        for arg, dim in zip(args, token_dims, strict=False):  # eps and dtypes come last
            if dim is not None:
                torch._dynamo.maybe_mark_dynamic(arg, dim % arg.dim())
        return compiled(*args)
    return call


class _RecompileLimitFilter(logging.Filter):
    """Turns dynamo's multi-line recompile-limit warning into one line on our logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "recompile_limit" not in message and "cache_size_limit" not in message:
            return True
        first = message.strip().splitlines()[0]
        log.warning("torch.compile recompile limit hit, the function now runs eager: %s", first)
        return False


def install_recompile_reporter() -> None:
    """Idempotent: one filter on dynamo's loggers, however many models compile."""
    for name in ("torch._dynamo", "torch._dynamo.convert_frame"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RecompileLimitFilter) for f in logger.filters):
            logger.addFilter(_RecompileLimitFilter())
