"""Triton decode kernels: split-KV paged attention reading pages and lengths on the device, and
the GDN conv update and recurrence in place on the slot pools. No host plan, no host reads."""

from __future__ import annotations

import dataclasses
from functools import partial

import torch

from resident.backends.base import DecodeKernels
from resident.backends.gemv_table import (
    GemvTable,
    RunsInstead,
    table_linear,
    table_linear_add_norm,
)
from resident.kernels.add_norm import add_rms_norm
from resident.kernels.attention_prologue import attention_prologue
from resident.kernels.decode_attention import (
    DEFAULT_DECODE_SPLITS,
    decode_tile,
    paged_decode_attention,
)
from resident.kernels.embedding import embedding
from resident.kernels.gdc import KeptZeros
from resident.kernels.gdn_decode import causal_conv_decode, gated_delta_rule_decode
from resident.kernels.gdn_layer_decode import GdnLayerScratch, gdn_layer_decode
from resident.kernels.gemv import (
    DEFAULT_FMA_TILE,
    FMA_MAX_ROWS,
    GATED_OUT_TILE,
    MAX_ROWS,
    MIN_DOT,
    gated_norm_linear_partials,
    sigmoid_gate_linear_partials,
    silu_mul_wide_linear,
    skinny_linear,
    skinny_linear_add_norm,
    skinny_linear_partials,
    wide_linear,
)
from resident.kernels.kv_write import write_kv
from resident.kernels.pdl import pdl_on
from resident.model.ops import ModelOps
from resident.model.step import StepMeta


def write_kv_triton_op(kv_layer, key, value, meta: StepMeta) -> None:
    write_kv(kv_layer, key, value, meta.kv_write_loc)


def conv_decode_op(x, weight, conv_pool, meta: StepMeta, widths: tuple[int, int, int],
                   head_dim: int):
    del head_dim  # the decode delta rule kernel normalises query and key itself
    return causal_conv_decode(x, weight, conv_pool, meta.state_slots, meta.query_start_loc,
                              1).split(widths, dim=-1)


def gated_delta_rule_decode_op(query, key, value, a, b, a_log, dt_bias, state_pool,
                               meta: StepMeta):
    return gated_delta_rule_decode(query, key, value, a, b, state_pool, meta.state_slots,
                                   meta.query_start_loc, 1, gate_params=(a_log, dt_bias))


def attention_decode_op(query, kv_layer, meta: StepMeta, scale: float, *, pdl: bool = False,
                        gate=None, meeting: KeptZeros | None = None, num_sms: int = 0):
    """The split-KV decode attention; its keys split and tiled as decode_tile gives the
    bucket (its rows, query's first dimension) on num_sms SMs (decode_splits=auto); given 0,
    8 splits of the kernel's own tile."""
    num_splits, block_n = (DEFAULT_DECODE_SPLITS, None) if not num_sms else decode_tile(
        query.shape[0], kv_layer.shape[3], num_sms, query.shape[2])
    return paged_decode_attention(query, kv_layer, meta.block_tables, None, meta.positions,
                                  scale, num_splits, pdl=pdl, gate=gate, meeting=meeting,
                                  block_n=block_n)


def gated_attention_decode_op(query, gate, kv_layer, meta: StepMeta, scale: float, **kwargs):
    return attention_decode_op(query, kv_layer, meta, scale, gate=gate, **kwargs)


def gdn_layer_op(projected, weights, conv_pool, state_pool, meta: StepMeta, *,
                 scratch: GdnLayerScratch, pdl: bool):
    return gdn_layer_decode(projected, weights, conv_pool, state_pool, meta.state_slots,
                            scratch, pdl=pdl)


def attention_prologue_op(qkv, q_norm_weight, k_norm_weight, eps, inv_freq, kv_layer,
                          meta: StepMeta, heads, *, pdl: bool):
    return attention_prologue(qkv, q_norm_weight, k_norm_weight, eps, meta.positions, inv_freq,
                              kv_layer, meta.kv_write_loc, heads, pdl=pdl)


# The fused GDN layer's widest bucket: on the H200 (0.8B) it beat the three kernels it replaces
# at c=1 (6.0 us a layer against 7.5) and c=16, and lost at c=64 (60 us against 44) and c=256
# (246 against 189), where the unfused delta rule streams the state at 74% of the copy
# bandwidth (results/2026-12-03-h200-0.8b-fused-decode)
FUSED_GDN_MAX_ROWS = 16
# The widest gate_up weight whose GEMV takes the MLP's silu-mul in its epilogue: the Triton
# GEMV's tiles read a wide weight at ~2 TB/s on an H100, where cuBLAS reads a large one
# faster, so a large weight loses more than the silu-mul kernel it saves. The 0.8B's 14.7 MB
# measured faster with it, the 9B's 201 MB 2% slower a step at c=1 and c=16
# (results/2026-12-06-h100-prefetch-once). The 2B's 50 MB keeps it, as its fused step was
# measured (-11% at c=1 against fused_decode=off, the epilogue's share not measured apart);
# the 4B's 94 MB, measured neither way, goes with the 9B.
GATE_UP_EPILOGUE_MAX_BYTES = 64 << 20
# The narrowest hidden size whose decode add + norm runs on kernels/add_norm.py. Inductor's
# loops over a row of more than 1,024 columns; alone, in a graph, the kernel took 1.4-2.7 us a
# one-row call at 2,048-4,096 columns against Inductor's 1.9-5.8 (H100). In whole steps (H100,
# bench, against the same tree without it): the 9B -1.0 / -0.5% at c=1 / c=16 (twice), the 4B
# -0.5 / +0.4%, the 2B +1.0 / -1.9% (results/2026-12-07-h100-add-norm), so only the 9B's width
NORM_KERNEL_MIN_HIDDEN = 4096


@dataclasses.dataclass(frozen=True)
class DecodeFusion:
    """What the fused_decode and pdl knobs give a decode backend on its device. fused: the
    embedding's gather, the attention prologue and the GDN layer kernel (bucket_ops), the
    MLP's silu-mul in its gate_up GEMV (_mlp), the gated attention's output gate in the Triton
    decode attention's combine (TritonDecode). epilogues (fused_decode=full): the elementwise
    work after a kernel in that kernel's last pass, so it has no kernel of its own: the next
    block's add + norm in each narrow projection's Triton GEMV of a small bucket
    (kernels/gemv.py skinny_linear_add_norm), with the MLP's silu-mul in its down projection's
    at 1-4 rows; and in every bucket the Triton decode attention's combine, with the gated
    attention's output gate, in its split pass's last programs. Their programs meet in
    `meeting` (one kernel runs at a time, and each leaves its counters at zero). norm_kernel
    (fused, a hidden size of at least NORM_KERNEL_MIN_HIDDEN): each block's add + norm that no
    projection runs on kernels/add_norm.py, in every bucket."""

    fused: bool = False
    pdl: bool = False
    epilogues: bool = False
    # fused: whether the model's gate_up is small enough for the silu-mul epilogue
    gate_up_epilogue: bool = True
    norm_kernel: bool = False
    meeting: KeptZeros = dataclasses.field(default_factory=KeptZeros, compare=False)

    @classmethod
    def of(cls, fused_decode: str, pdl: str, device: torch.device,
           gate_up_bytes: int = 0, hidden_size: int = 0) -> DecodeFusion:
        """gate_up_bytes: the model's gate_up weight (GATE_UP_EPILOGUE_MAX_BYTES);
        hidden_size: its rows' width (NORM_KERNEL_MIN_HIDDEN)."""
        fused = fused_decode in ("auto", "full")
        return cls(fused, pdl_on(pdl, device), fused_decode == "full",
                   gate_up_bytes <= GATE_UP_EPILOGUE_MAX_BYTES,
                   fused and hidden_size >= NORM_KERNEL_MIN_HIDDEN)

    def describe(self) -> str:
        """What the decode buckets fuse, for the start-up log: the kernels that differ by
        model (the silu-mul's, the add + norm's) named."""
        if not self.fused:
            return f"fused_decode off: separate kernels, pdl {'on' if self.pdl else 'off'}"
        silu_mul = (f"in gate_up's epilogue up to {MIN_DOT} rows" if self.gate_up_epilogue
                    else f"its own kernel (gate_up over {GATE_UP_EPILOGUE_MAX_BYTES >> 20} MB)")
        add_norm = (f"kernels/add_norm.py (hidden >= {NORM_KERNEL_MIN_HIDDEN:,})"
                    if self.norm_kernel else "Inductor's")
        if self.epilogues:
            silu_mul = f"in the down GEMV up to {FMA_MAX_ROWS} rows, else {silu_mul}"
            add_norm = f"in the narrow GEMVs' epilogues up to {MIN_DOT} rows, else {add_norm}"
        return (f"fused_decode: GDN layer one kernel up to {FUSED_GDN_MAX_ROWS} rows, attention "
                f"prologue, silu-mul {silu_mul}, add + norm {add_norm}; "
                f"pdl {'on' if self.pdl else 'off'}")

    def bucket_ops(self, ops: ModelOps, buckets: tuple[int, ...]) -> dict[int, ModelOps]:
        """Each bucket's ops under fused_decode: the token embedding's one-kernel gather, the
        attention prologue and (norm_kernel) the add + norm kernel in every bucket, the GDN
        layer kernel in buckets of up to FUSED_GDN_MAX_ROWS rows."""
        if not self.fused:
            return dict.fromkeys(buckets, ops)
        prologue = dataclasses.replace(
            ops, attention_prologue=partial(attention_prologue_op, pdl=self.pdl),
            embed=embedding,
            add_norm=partial(add_rms_norm, pdl=self.pdl) if self.norm_kernel else None)
        small = [bucket for bucket in buckets if bucket <= FUSED_GDN_MAX_ROWS]
        if not small:
            return dict.fromkeys(buckets, prologue)
        layer = dataclasses.replace(prologue, gdn_layer=partial(
            gdn_layer_op, scratch=GdnLayerScratch(max(small)), pdl=self.pdl))
        return {bucket: layer if bucket <= FUSED_GDN_MAX_ROWS else prologue
                for bucket in buckets}

    def small_bucket_ops(self, ops: ModelOps, bucket: int,
                         table: GemvTable | None) -> ModelOps:
        """The projections of a bucket of at most 16 rows on the Triton GEMV (decode_gemm
        skinny or wide): PDL and the epilogues as this fusion says, then a measured table's
        picks."""
        return self._mlp(self._table(self._gemms(ops), table), bucket, table)

    def medium_bucket_ops(self, ops: ModelOps, table: GemvTable | None) -> ModelOps:
        """The projections of a bucket of 17 to MAX_ROWS rows: cuBLAS, but each shape a
        measured table holds in the bucket's row class on its winner (the Triton GEMV's wgmma
        tiles, launched with PDL under pdl). No epilogue: the add + norm's holds 16 rows at
        most."""
        return self._table(ops, table)

    def _table(self, ops: ModelOps, table: GemvTable | None) -> ModelOps:
        """Each projection of a shape the table holds on its measured winner (the ops given
        run the others)."""
        if table is None:
            return ops
        add_norm = ops.narrow_linear_add_norm
        return dataclasses.replace(
            ops,
            narrow_linear=partial(table_linear, table=table, fallback=ops.narrow_linear,
                                  triton_linear=skinny_linear_partials, pdl=self.pdl),
            wide_linear=partial(table_linear, table=table, fallback=ops.wide_linear,
                                triton_linear=skinny_linear, pdl=self.pdl),
            narrow_linear_add_norm=add_norm and partial(
                table_linear_add_norm, table=table, fallback=add_norm, scratch=self.meeting,
                pdl=self.pdl))

    def _mlp(self, ops: ModelOps, bucket: int, table: GemvTable | None) -> ModelOps:
        """Where the MLP's silu-mul runs. Under epilogues, a bucket of at most FMA_MAX_ROWS
        rows runs it, the down projection and the next add + norm in one CUDA-core kernel:
        the activation there costs the rows there are (in the MMA form's 16-row tiles it
        measured slower than its own kernel, results/2026-11-29-h200-0.8b-fusions). Else,
        when fused and the weight is at most GATE_UP_EPILOGUE_MAX_BYTES, in the gate_up
        GEMV's epilogue (gemv.silu_mul_wide_linear on GATED_OUT_TILE), which runs gate_up in
        place of the table's entry or cuBLAS: the activation then has no kernel of its own,
        and its two [T, I] halves never go through memory."""
        if self.epilogues and bucket <= FMA_MAX_ROWS:
            return dataclasses.replace(ops, silu_mul_linear_add_norm=partial(
                silu_mul_linear_add_norm_op, table=table, scratch=self.meeting, pdl=self.pdl))
        if self.gate_up_in_epilogue(bucket):
            return dataclasses.replace(ops, silu_mul_wide_linear=partial(
                silu_mul_wide_linear, pdl=self.pdl))
        return ops

    def gate_up_in_epilogue(self, bucket: int) -> bool:
        """Whether a bucket of at most MIN_DOT rows runs the MLP's gate_up with the silu-mul
        in its epilogue (_mlp), whatever a gemv table holds for gate_up."""
        return (bucket <= MIN_DOT and self.fused and self.gate_up_epilogue
                and not (self.epilogues and bucket <= FMA_MAX_ROWS))

    def table_note(self, gate_up_shape: tuple[int, int]) -> RunsInstead:
        """For the gemv table's start-up log (GemvTable.describe's `runs_instead`): the
        kernel a bucket runs for a shape in place of the table's entry, or None."""
        def runs_instead(n: int, k: int, bucket: int) -> str | None:
            if (n, k) == gate_up_shape and self.gate_up_in_epilogue(bucket):
                return f"{GATED_OUT_TILE.name} with the silu-mul epilogue"
            return None
        return runs_instead

    def _gemms(self, ops: ModelOps) -> ModelOps:
        """A small bucket's projections on the Triton GEMV: under epilogues the narrow ones
        with the next add + norm; under pdl launched with PDL, each starting to read its
        weights while the kernel before runs."""
        replaced = {}
        if self.epilogues:
            replaced["narrow_linear_add_norm"] = partial(skinny_linear_add_norm,
                                                         scratch=self.meeting, pdl=self.pdl)
        if self.pdl:
            replaced["narrow_linear"] = partial(ops.narrow_linear, pdl=True)
            if ops.wide_linear is wide_linear:
                replaced["wide_linear"] = partial(wide_linear, pdl=True)
        return dataclasses.replace(ops, **replaced)


GDN_DECODE_OPS = ModelOps(write_kv=write_kv_triton_op, conv=conv_decode_op,
                          gated_delta_rule=gated_delta_rule_decode_op)


def silu_mul_skinny_linear(gate_up, weight):
    return skinny_linear_partials(gate_up, weight, gated=True)


def silu_mul_linear_add_norm_op(gate_up, weight, residual, norm_weight, eps, *,
                                table: GemvTable | None, scratch: KeptZeros, pdl: bool):
    """The MLP's silu-mul, down projection and next add + norm on a CUDA-core tile: the
    table's, where it measured one for the shape and rows, else DEFAULT_FMA_TILE."""
    choice = table.choose(*weight.shape, gate_up.shape[0]) if table is not None else None
    tile = choice.tile if choice is not None and choice.tile.fma else DEFAULT_FMA_TILE
    return skinny_linear_add_norm(gate_up, weight, residual, norm_weight, eps, scratch, tile,
                                  gated=True, pdl=pdl)


def decode_gemm_ops(ops: ModelOps, bucket: int, decode_gemm: str = "skinny",
                    fusion: DecodeFusion | None = None,
                    table: GemvTable | None = None) -> ModelOps:
    """The decode_gemm knob. A bucket of at most 16 rows runs its narrow projections (out_proj,
    o_proj, down) on the skinny Triton GEMM (measured against cuBLAS in
    results/2026-11-29-h200-0.8b-fusions/gemv_cold.json), its split-K partials added up by the
    add + norm that follows; under `fused` the MLP's silu-mul, the GDN output norm and the
    attention output gate run inside those projections' kernels, which measured slower: 1.31 ms
    of GPU time a c=1 step on the 0.8B against 1.03 (results/2026-11-29-h200-0.8b-fusions). The
    wide projections stay on cuBLAS (as fast there alone) but under `wide`. Under pdl the
    Triton GEMMs launch with PDL. `cublas` and wider buckets keep `ops`. A measured `table`
    (the gemv_table knob, gemv_table.py) picks the kernel of each shape it holds under
    `skinny` and `wide`, and in a bucket of 17 to MAX_ROWS rows, which the rule leaves on
    cuBLAS, it alone moves a projection to the Triton GEMV."""
    if bucket > MAX_ROWS or decode_gemm == "cublas" or (bucket > MIN_DOT
                                                        and decode_gemm == "fused"):
        return ops
    if bucket > MIN_DOT:
        return (fusion or DecodeFusion()).medium_bucket_ops(ops, table)
    ops = dataclasses.replace(ops, narrow_linear=skinny_linear_partials)
    if decode_gemm == "wide":
        ops = dataclasses.replace(ops, wide_linear=wide_linear)
    if decode_gemm in ("skinny", "wide"):
        return (fusion or DecodeFusion()).small_bucket_ops(ops, bucket, table)
    return dataclasses.replace(ops, silu_mul_linear=silu_mul_skinny_linear,
                               gated_norm_linear=gated_norm_linear_partials,
                               sigmoid_gate_linear=sigmoid_gate_linear_partials)


class TritonDecode(DecodeKernels):
    name = "triton"

    def __init__(self, buckets: tuple[int, ...], decode_gemm: str = "skinny",
                 fusion: DecodeFusion | None = None, table: GemvTable | None = None,
                 num_sms: int = 0) -> None:
        """num_sms: the device's SMs, which size each bucket's attention splits and tile
        (decode_splits=auto); 0: 8 splits of the kernel's own tile in every bucket."""
        fusion = fusion or DecodeFusion()
        # under epilogues the attention is one kernel (its combine in the split pass); fused,
        # the combine writes the output gated, so the gate has no kernel of its own
        meeting = fusion.meeting if fusion.epilogues else None
        attention = partial(attention_decode_op, pdl=fusion.pdl, meeting=meeting,
                            num_sms=num_sms)
        gated = partial(gated_attention_decode_op, pdl=fusion.pdl, meeting=meeting,
                        num_sms=num_sms) if fusion.fused else None
        ops = dataclasses.replace(GDN_DECODE_OPS, attention=attention, gated_attention=gated)
        fused = fusion.bucket_ops(ops, buckets)
        self._ops = {bucket: decode_gemm_ops(fused[bucket], bucket, decode_gemm, fusion, table)
                     for bucket in buckets}
        self.gemv_table = table and table.source

    def ops(self, bucket: int) -> ModelOps:
        return self._ops[bucket]
