"""Compiles the decode step's Triton kernels for a GPU target, without a GPU.

    python -m resident.tools.compile_check [--model qwen3.5-0.8b] [--arch 90]

The interpreter (TRITON_INTERPRET=1, the CPU tests) checks what a kernel computes, not whether
the GPU compiler takes it: a constexpr branch, a helper's tuple return or a tile's shared memory
can still fail there, and a kernel that compiles can still spill registers to local memory,
which made the fused add + norm GEMM prologue about ten times slower than its weight read
(results/2026-11-29-h200-0.8b-decode-gemm). This runs Triton's own compiler and ptxas on each
kernel variant a decode step launches, and the prefill's GDN conv, at the model's shapes, and
prints each one's shared memory against the limit, its registers and its spill bytes; shared
memory over the limit or a spill fails it. It needs no driver; run it with TRITON_INTERPRET
unset (the kernels must be JIT functions).

Each kernel is compiled as typed, without what a launch specializes on (an int argument equal to
1 becomes a constant; ints that are multiples of 16 and 16-byte-aligned pointers get a
divisibility hint), so addresses are computed in full and loads are not vectorized or pipelined:
registers read high (decode attention's split pass at the 0.8B: 241 here, 92 with its launch's
hints) and shared memory can read low (25,600 bytes here, 41,984 with them, the K/V tiles then
staged through cp.async). bench.py records the launched kernels' own figures
(compiled_kernels.py). Two kernels are the exception. The GEMV's variants get the hints their
launches get on the model's weights (GEMV_ALIGNED: the pointers, N, K and the strides are
16-divisible there), and with them the cp.async pipeline the launched kernels have; without them
the 16-row tiles read 168-250 registers and no pipeline, where launched on an H100 they hold 38-72
and 36,864 bytes of shared memory (results/2026-12-07-h100-medium-gemv, bench logs). The fused
GDN layer's get its launch's too (GDN_LAYER_ALIGNED and its pointers; GDN_LAYER_ONES, the unit
strides as constants): 121 registers as launched, 250 without (results/2026-12-07-h100-gdn-rows).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from resident.config import EngineConfig
from resident.engine.sampling_state import FLOATS_AT, INDEX_COL, STAGED_WIDTH
from resident.engine.token_ring import HEADER_BYTES, NUM_SLOTS, TokenRing
from resident.kernels import (
    argmax,
    attention_prologue,
    chunk_states,
    conv_varlen,
    decode_attention,
    gdn_decode,
    gdn_layer_decode,
    gemv,
    gumbel_race,
    kv_write,
    nucleus_race,
    publish,
    slot_params,
    varlen_attention,
)
from resident.model.config import ModelConfig, load_model_config

HOPPER_SHARED_BYTES = 232448  # per block, opt-in maximum on sm_90


@dataclass(frozen=True)
class Variant:
    """One kernel launch as the decode step makes it: argument types and constexprs."""

    name: str
    kernel: triton.JITFunction
    types: dict[str, str]  # every non-constexpr argument: "*bf16", "i32", "fp32", ...
    constexprs: dict[str, object]
    num_warps: int = 4
    num_stages: int = 3
    # spill bytes that do not fail it: 0 for kernels whose one config we chose; an autotuned
    # kernel's configs are timed on the GPU, so one that spills only loses that race
    allowed_spill: int = 0
    max_registers: int = 0  # the launch's maxnreg; 0: none
    # arguments compiled as the launch specializes them when 16-divisible (aligned pointers,
    # ints): its cp.async pipeline, which a kernel compiled without can spill in its place
    aligned: tuple[str, ...] = ()
    # int arguments the launch passes as 1 (a unit stride), which it specializes to a constant
    ones: tuple[str, ...] = ()

    def compile(self, target: GPUTarget):
        types = {name: t for name, t in self.types.items() if name not in self.ones}
        constexprs = self.constexprs | dict.fromkeys(self.ones, 1)
        signature = {name: types.get(name, "constexpr") for name in self.kernel.arg_names}
        missing = [n for n, t in signature.items() if t == "constexpr" and n not in constexprs]
        if missing:
            raise ValueError(f"{self.name}: no type or constexpr for {missing}")
        attrs = {(at,): [["tt.divisibility", 16]] for at, name in enumerate(self.kernel.arg_names)
                 if name in self.aligned}
        source = ASTSource(fn=self.kernel, signature=signature, constexprs=constexprs,
                           attrs=attrs)
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.max_registers:
            options["maxnreg"] = self.max_registers
        return triton.compile(source, target=target, options=options)


GEMV_ALIGNED = ("x", "w", "out", "N", "K", "stride_xm", "stride_wn", "stride_om", "stride_os")


def _gemv(name: str, n: int, k: int, tile: gemv.GemvTile, prologue, *,
          head_dim: int = 1, pdl: bool = False, add_norm: bool = False,
          rows: int = gemv.MIN_DOT, dtype: torch.dtype = torch.bfloat16,
          gated_out: bool = False) -> Variant:
    """The GEMV at a shape ([N, K]; gated_out: [2N, K], the silu-mul's output in `dtype`), its
    activations and weights in `dtype`, compiled with the launch's divisibility hints
    (GEMV_ALIGNED); `rows` set the tile's rows where the tile does not (gemv.block_rows)."""
    element = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}[dtype]
    types = {name: element for name in ("x", "w", "z", "norm_w", "residual", "out_norm_w",
                                        "normed_out", "summed_out")}
    types |= {"out": element if gated_out else "*fp32", "eps": "fp32", "counts": "*i32",
              "sums_sq": "*fp32", "out_eps": "fp32"}
    types |= {arg: "i32" for arg in ("M", "N", "K", "stride_xm", "stride_wn", "stride_om",
                                     "stride_os", "stride_zm", "stride_zh")}
    constexprs = gemv.launch_constexprs(n, k, rows, tile, prologue, head_dim=head_dim,
                                        add_norm=add_norm, dtype=dtype,
                                        element_size=dtype.itemsize, gated_out=gated_out)
    return Variant(name, gemv._gemv_kernel, types, constexprs | {"USE_PDL": pdl},
                   tile.num_warps, tile.num_stages, aligned=GEMV_ALIGNED)


def decode_variants(config: ModelConfig) -> list[Variant]:
    """The Triton kernels of a decode bucket of at most 16 rows (and the GEMV's wgmma tiles),
    and the prefill's GDN conv, at the model's shapes."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_dim = config.num_attention_heads * config.head_dim
    narrow = gemv.DEFAULT_TILE
    in_proj = config.decode_projections["gdn in_proj"][0]
    by_head = gemv.dataclasses.replace(narrow, block_k=config.linear_value_head_dim)
    variants = [
        _gemv("gdn out_proj + gated_rms_norm", hidden, config.linear_value_dim, by_head,
              gemv.GATED_RMS_NORM, head_dim=config.linear_value_head_dim),
        _gemv("attn o_proj + sigmoid gate", hidden, q_dim, narrow, gemv.SIGMOID_GATE,
              head_dim=config.head_dim),
        _gemv("mlp down + silu_mul", hidden, inter, narrow, gemv.SILU_MUL),
        _gemv("plain skinny GEMM", hidden, q_dim, narrow, gemv.PLAIN),
        _gemv("plain skinny GEMM (PDL, weights to L2 first)", hidden, q_dim, narrow, gemv.PLAIN,
              pdl=True),
        # a float32 model's: tl.dot at full precision (ieee), not tf32
        _gemv("plain skinny GEMM, float32 (PDL)", hidden, q_dim, narrow, gemv.PLAIN, pdl=True,
              dtype=torch.float32),
        _gemv("mlp down + next add + norm (PDL)", hidden, inter, narrow, gemv.PLAIN, pdl=True,
              add_norm=True),
        _gemv("gdn out_proj + next add + norm", hidden, config.linear_value_dim, narrow,
              gemv.PLAIN, add_norm=True),
        *(_gemv(f"CUDA-core GEMV 16x512, {rows} row{'s' if rows > 1 else ''} (PDL)", hidden,
                config.linear_value_dim, gemv.GemvTile(16, 512, 4, 3, fma=True), gemv.PLAIN,
                pdl=True, rows=rows) for rows in (1, 4)),
        *(_gemv(f"mlp silu-mul + down + next add + norm, CUDA-core, {rows} row"
                f"{'s' if rows > 1 else ''} (PDL)", hidden, inter, gemv.DEFAULT_FMA_TILE,
                gemv.SILU_MUL, pdl=True, add_norm=True, rows=rows) for rows in (1, 4)),
        _gemv("wide GEMM: gdn in_proj (PDL)", in_proj, hidden, gemv.WIDE_TILE, gemv.PLAIN,
              pdl=True),
        _gemv("wide GEMM: mlp gate_up (PDL)", 2 * inter, hidden, gemv.WIDE_TILE, gemv.PLAIN,
              pdl=True),
        _gemv("wide GEMM: mlp gate_up + silu-mul (PDL)", inter, hidden, gemv.GATED_OUT_TILE,
              gemv.PLAIN, pdl=True, gated_out=True),
        # a bucket of 17-256 rows on a measured table's wgmma tile: without the launch's
        # hints ptxas spills 84-480 bytes the pipeline never holds
        *(_gemv(f"{tile.block_m}-row GEMM {tile.name}, {rows} rows (PDL)", n, k, tile,
                gemv.PLAIN, pdl=True, rows=rows) for n, k, rows, tile in (
            (in_proj, hidden, 64, gemv.GemvTile(64, 128, 4, 4, 0, block_m=64)),
            (hidden, inter, 24, gemv.GemvTile(32, 128, 4, 4, 264, block_m=64)),
            (in_proj, hidden, 128, gemv.GemvTile(64, 64, 8, 4, 0, block_m=128)),
            (hidden, inter, 96, gemv.GemvTile(32, 128, 8, 4, 264, block_m=128)),
            (in_proj, hidden, 256, gemv.GemvTile(64, 64, 8, 4, 0, block_m=256)),
            (hidden, inter, 192, gemv.GemvTile(32, 64, 8, 4, 264, block_m=256)))),
    ]
    gdn_types = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "g_ptr", "beta_ptr",
                                             "a_log_ptr", "dt_bias_ptr", "out_ptr")}
    gdn_types |= {"state_ptr": "*fp32", "slots_ptr": "*i64", "scale": "fp32", "eps": "fp32"}
    gdn_types |= {arg: "i32" for arg in gdn_decode._gdn_decode_kernel.arg_names
                  if arg.startswith("stride_") or arg in ("group", "k_dim", "v_dim")}
    # l2norm_qk: decode steps normalise q and k in the kernel; a mixed step's decode rows get
    # them normalised by the varlen conv; from WIDE_ROWS rows a program takes WIDE_BLOCK_DV
    # columns, over an fp32 or (gdn_state_dtype) bf16 state. Those spill 76-112 bytes a
    # thread at 4 warps and were chosen all the same: they measured 9% (fp32) and 32% (bf16)
    # faster a layer at 256 rows than 32 columns, which spill nothing
    # (results/2026-12-06-h100-state-bf16); 128 bytes catches a change that spills more
    variants += [Variant(name, gdn_decode._gdn_decode_kernel, gdn_types | {"state_ptr": state}, {
        "BLOCK_DK": triton.next_power_of_2(config.linear_key_head_dim),
        "BLOCK_DV": block_dv, "COMPUTE": triton.language.float32,
        "RAW_GATES": True, "L2NORM_QK": l2norm}, gdn_decode.GDN_NUM_WARPS,
        allowed_spill=128 if block_dv == gdn_decode.WIDE_BLOCK_DV else 0)
        for name, l2norm, block_dv, state in (
            ("gdn decode + gates", True, gdn_decode.GDN_BLOCK_DV, "*fp32"),
            ("gdn decode, q/k normed", False, gdn_decode.GDN_BLOCK_DV, "*fp32"),
            ("gdn decode + gates, wide", True, gdn_decode.WIDE_BLOCK_DV, "*fp32"),
            ("gdn decode, q/k normed, wide", False, gdn_decode.WIDE_BLOCK_DV, "*fp32"),
            ("gdn decode + gates, wide, bf16 state", True, gdn_decode.WIDE_BLOCK_DV, "*bf16"))]
    variants += _conv_decode_variants(config)
    variants += _fused_decode_variants(config)
    variants += _decode_attention_variants(config)
    variants.append(_argmax_variant(config))
    variants.append(_gumbel_race_variant())
    variants += _nucleus_race_variants(config)
    variants.append(_publish_variant())
    variants.append(Variant("sampling parameters by slot", slot_params._take_kernel, {
        "table_floats": "*fp32", "table_ints": "*i64", "slot_ids": "*i64", "out_floats": "*fp32",
        "out_ints": "*i64"}, {"WIDTH": 3, "BLOCK": 4, "INDEX_COL": INDEX_COL}, 1))
    variants.append(Variant("sampling rows written by slot", slot_params._put_kernel, {
        "staged_ints": "*i64", "staged_floats": "*fp32", "table_floats": "*fp32",
        "table_ints": "*i64"}, {"WIDTH": 3, "STAGED_WIDTH": STAGED_WIDTH,
                                "FLOATS_AT": FLOATS_AT, "BLOCK": 4}, 1))
    variants += _conv_varlen_variants(config)
    variants += _chunk_states_variants(config)
    variants += _varlen_attention_variants(config)
    kv_width = config.num_key_value_heads * config.head_dim
    variants.append(Variant("kv write", kv_write._write_kv_kernel, {
        "kv": "*bf16", "key": "*bf16", "value": "*bf16", "loc": "*i64", "stride_key": "i64",
        "stride_value": "i64", "stride_page": "i64", "stride_kv": "i64", "stride_slot": "i64"},
        {"PAGE": 16, "WIDTH": kv_width, "BLOCK": triton.next_power_of_2(kv_width)}))
    return variants


def _decode_attention_variants(config: ModelConfig) -> list[Variant]:
    """Decode attention (8 splits, PDL) as the decode step launches it: the split pass and the
    combine, with and without the output gate, and the split pass that combines itself (a
    meeting: fused_decode=full); the combines again at the most splits decode_tile gives, and
    the split pass at a wide bucket's tile."""
    block_d = triton.next_power_of_2(config.head_dim)
    block_n, launch = decode_attention._tile_config(block_d, None)
    group = config.num_attention_heads // config.num_key_value_heads
    common = {"HEAD_DIM": config.head_dim, "NUM_SPLITS": 8, "BLOCK_S": 8, "BLOCK_D": block_d,
              "USE_PDL": True, "COMPUTE": triton.language.float32}
    split = decode_attention._split_kernel
    split_types = {"query": "*bf16", "kv": "*bf16", "block_tables": "*i32", "positions": "*i64",
                   "partial_out": "*fp32", "partial_lse": "*fp32", "qk_scale": "fp32",
                   "width": "i32", "out": "*bf16", "gate": "*bf16", "counts": "*i32"}
    split_types |= {arg: "i32" for arg in split.arg_names if arg.startswith("stride_")}
    split_shape = common | {"GROUP": group, "PAGE_SIZE": 16,
                            "BLOCK_G": max(triton.next_power_of_2(group), 16),
                            "BLOCK_N": block_n, "DOT_PRECISION": "tf32", "WHILE_LOOP": False}
    combine = decode_attention._combine_kernel
    combine_types = {name: split_types[name] for name in ("partial_out", "partial_lse", "out",
                                                           "gate")}
    combine_types |= {arg: "i32" for arg in combine.arg_names if arg.startswith("stride_")}
    most = {"NUM_SPLITS": decode_attention.MAX_DECODE_SPLITS,
            "BLOCK_S": decode_attention.MAX_DECODE_SPLITS}
    # a wide bucket's tile: 256 rows on an H100's or H200's 132 SMs
    wide = decode_attention.decode_tile(256, config.num_key_value_heads, 132, config.head_dim)
    wide_n, wide_launch = decode_attention._tile_config(block_d, wide.block_n)
    return [
        Variant(f"decode attention split, a wide bucket's {wide.num_splits} x {wide_n} keys "
                "(PDL, decode_splits=auto at c=256)", split, split_types,
                split_shape | {"BLOCK_N": wide_n, "NUM_SPLITS": wide.num_splits,
                               "BLOCK_S": triton.next_power_of_2(wide.num_splits),
                               "MERGED": False, "GATED": False}, **wide_launch),
        Variant("decode attention split (PDL)", split, split_types,
                split_shape | {"MERGED": False, "GATED": False}, **launch),
        Variant("decode attention split + combine + output gate (PDL, a meeting)", split,
                split_types, split_shape | {"MERGED": True, "GATED": True}, **launch),
        *(Variant(f"decode attention combine{' + output gate' if gated else ''} (PDL)",
                  combine, combine_types, common | {"GATED": gated}) for gated in (False, True)),
        Variant("decode attention combine + output gate, 64 splits (PDL, decode_splits=auto "
                "at c=1)", combine, combine_types, common | most | {"GATED": True}),
        Variant("decode attention split + combine + output gate, 64 splits (PDL, a meeting)",
                split, split_types, split_shape | most | {"MERGED": True, "GATED": True},
                **launch),
    ]


def _argmax_variant(config: ModelConfig) -> Variant:
    """The rows' argmax (argmax=triton) over the model's bf16 logits, with PDL."""
    num_blocks = triton.cdiv(config.vocab_size, argmax.BLOCK)
    types = {"logits": "*bf16", "out": "*i64", "best_values": "*fp32", "best_ids": "*i32",
             "counts": "*i32", "vocab": "i32", "stride_row": "i32"}
    return Variant("rows argmax (PDL)", argmax._rows_argmax_kernel, types,
                   {"NUM_BLOCKS": num_blocks, "BLOCKS_P2": triton.next_power_of_2(num_blocks),
                    "BLOCK": argmax.BLOCK, "USE_PDL": True}, argmax.NUM_WARPS)


def _publish_variant() -> Variant:
    """The token ring's publish (engine/token_ring.py) at the default decode buckets' ring."""
    ring = TokenRing(torch.device("cpu"), EngineConfig().max_decode_rows)
    types = {"src": "*u8", "ring": "*u8", "ring_words": "*i64", "count_cell": "*i64",
             "num_bytes": "i32"}
    return Variant("token ring publish", publish._publish_kernel, types,
                   {"SLOT_BYTES": ring.slot_bytes, "HEADER": HEADER_BYTES, "SLOTS": NUM_SLOTS,
                    "BLOCK": publish.BLOCK}, 1)


def _gumbel_race_variant() -> Variant:
    """The sampler's race over float32 filtered logits, at its widest chunk."""
    types = {"scores": "*fp32", "stride": "i64", "keys": "*i64", "floors": "*fp32",
             "best_values": "*fp32", "best_ids": "*i64", "vocab": "i32", "num_chunks": "i32"}
    return Variant("sampler gumbel race", gumbel_race._race_kernel, types,
                   {"CHUNK": gumbel_race.MAX_CHUNK, "BLOCK": gumbel_race.MAX_BLOCK,
                    "FAST": True})


def _nucleus_race_variants(config: ModelConfig) -> list[Variant]:
    """The `triton` sampler's passes (kernels/nucleus_race.py) at the model's vocabulary, bf16
    logits, the parameters as float32 / int64 columns."""
    chunk, block, span = nucleus_race.launch_sizes(config.vocab_size)
    pivots = nucleus_race.PIVOTS
    by_name = {"logits": "*bf16", "temperatures": "*fp32", "top_ps": "*fp32",
               "min_ps": "*fp32", "top_ks": "*i64", "seeds": "*i64", "indices": "*i64",
               "greedy": "*i64", "ident": "*i64", "judged": "*i64", "tokens": "*i64",
               "arrivals": "*i32", "failures": "*i1",
               "racing": "*i32", "num_racing": "*i32",
               "stride": "i64", "floats_stride": "i64", "ints_stride": "i64"}

    def types(kernel: triton.JITFunction, constexprs: dict[str, object]) -> dict[str, str]:
        return {arg: by_name.get(arg, "i32" if arg in ("vocab", "num_chunks", "num_rows", "rounds")
                                 else "*fp32")
                for arg in kernel.arg_names if arg not in constexprs}

    first = {"CHUNK": chunk, "BLOCK": block, "SPAN": span, "PIVOTS": pivots,
             "PIVOTS_FROM": nucleus_race.PIVOTS_FROM, "FAST": True, "USE_PDL": True}
    round_one = {**first, "LAST": False}
    round_ = {**first, "STEP": 2, "LAST": False}
    last = {**first, "STEP": nucleus_race.ROUNDS, "LAST": True}
    return [Variant(f"sampler nucleus race {name} (PDL)", kernel, types(kernel, constexprs),
                    constexprs)
            for name, kernel, constexprs in (("first pass", nucleus_race._first_kernel, first),
                                             ("round 1", nucleus_race._round_one_kernel, round_one),
                                             ("round", nucleus_race._round_kernel, round_),
                                             ("last round", nucleus_race._round_kernel, last))]


# the fused GDN layer's arguments its launch at the 0.8B-9B shapes specializes: the pointers and
# the 16-divisible ints (aligned), the unit strides (ones). Without them ptxas gave it 250
# registers a thread, where launched it holds 121 (bench.py's compiled_kernels): 4 programs an
# SM, not 2
GDN_LAYER_ALIGNED = ("stride_pt", "stride_cn", "stride_sn", "stride_sh", "stride_sk",
                     "stride_ot", "stride_oh", "key_dim", "value_dim", "num_v_heads")
GDN_LAYER_ONES = ("stride_ww", "stride_cw", "stride_sv")


def _fused_decode_variants(config: ModelConfig) -> list[Variant]:
    """fused_decode's kernels (a GDN layer, an attention prologue), with and without PDL."""
    gdn = gdn_layer_decode._gdn_layer_decode_kernel
    gdn_aligned = GDN_LAYER_ALIGNED + tuple(arg for arg in gdn.arg_names if arg.endswith("_ptr"))
    gdn_types = {name: "*bf16" for name in ("proj_ptr", "conv_w_ptr", "conv_pool_ptr",
                                             "a_log_ptr", "dt_bias_ptr", "norm_w_ptr",
                                             "out_ptr")}
    gdn_types |= {"state_ptr": "*fp32", "slots_ptr": "*i64", "sum_sq_ptr": "*fp32",
                  "count_ptr": "*i32", "scale": "fp32", "l2_eps": "fp32",
                  "norm_eps": "fp32"}
    gdn_types |= {arg: "i32" for arg in gdn.arg_names if arg.startswith("stride_")
                  or arg in ("key_dim", "value_dim", "num_v_heads", "width")}
    group = config.linear_num_value_heads // config.linear_num_key_heads
    width = config.linear_conv_kernel_dim
    prologue = attention_prologue._attention_prologue_kernel
    prologue_types = {"qkv_ptr": "*bf16", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16",
                      "pos_ptr": "*i64", "inv_freq_ptr": "*fp32", "kv_ptr": "*bf16",
                      "loc_ptr": "*i64", "query_ptr": "*bf16", "eps": "fp32"}
    prologue_types |= {arg: "i32" for arg in prologue.arg_names if arg.startswith("stride_")
                       or arg in ("num_heads", "num_kv_heads")}
    gdn_constexprs = {
        "GROUP": group, "DK": config.linear_key_head_dim, "DV": config.linear_value_head_dim,
        "BLOCK_DV": min(gdn_layer_decode.BLOCK_DV, config.linear_value_head_dim),
        "BLOCK_W": triton.next_power_of_2(width), "COMPUTE": triton.language.float32}
    # the cap tests/gpu/time_gdn_layer.py times (not taken: results/2026-12-07-h100-medium-gemv):
    # 136 registers and no spill at the 0.8B with the hints (4 bytes without); 16 catches a
    # change that spills more
    capped = gdn_layer_decode.CAPPED_REGISTERS
    variants = [Variant(f"fused gdn layer decode (PDL, at most {capped} registers)", gdn,
                        gdn_types, gdn_constexprs | {"USE_PDL": True},
                        gdn_layer_decode.NUM_WARPS, allowed_spill=16, max_registers=capped,
                        aligned=gdn_aligned, ones=GDN_LAYER_ONES)]
    for pdl in (False, True):
        suffix = " (PDL)" if pdl else ""
        variants.append(Variant(f"fused gdn layer decode{suffix}", gdn, gdn_types,
                                gdn_constexprs | {"USE_PDL": pdl}, gdn_layer_decode.NUM_WARPS,
                                max_registers=gdn_layer_decode.MAX_REGISTERS,
                                aligned=gdn_aligned, ones=GDN_LAYER_ONES))
        variants.append(Variant(f"attention prologue{suffix}", prologue, prologue_types, {
            "D": config.head_dim, "ROT": config.rotary_dim, "PAGE": 16,
            "COMPUTE": triton.language.float32, "USE_PDL": pdl},
            attention_prologue.num_warps(config.head_dim)))
    return variants


def _varlen_attention_variants(config: ModelConfig) -> list[Variant]:
    """The prefill and mixed steps' paged attention (kernels/varlen_attention.py): one
    program a query block, and its keys split (varlen_splits=auto) in 2 and MAX_SPLITS."""
    kernel = varlen_attention._varlen_kernel
    group = config.num_attention_heads // config.num_key_value_heads
    tile = varlen_attention.tile_config(group, config.head_dim)
    types = {"query": "*bf16", "kv": "*bf16", "out": "*bf16", "block_tables": "*i32",
             "qsl": "*i64", "positions": "*i64", "qk_scale": "fp32", "num_rows": "i32",
             "partial_out": "*fp32", "partial_lse": "*fp32", "counts": "*i32"}
    types |= {arg: "i32" for arg in kernel.arg_names if arg.startswith("stride_")}
    constexprs = {
        "GROUP": group, "HEAD_DIM": config.head_dim, "PAGE_SIZE": 16,
        "BLOCK_Q": varlen_attention.BLOCK_Q, "BLOCK_M": tile.block_m, "BLOCK_D": tile.block_d,
        "BLOCK_N": tile.block_n, "DOT_PRECISION": "tf32", "WHILE_LOOP": False}
    return [Variant("prefill attention" + (f", {splits} key splits" if splits > 1 else ""),
                    kernel, types, constexprs | {"NUM_SPLITS": splits}, tile.num_warps, 2)
            for splits in (1, 2, varlen_attention.MAX_SPLITS)]


def _conv_decode_variants(config: ModelConfig) -> list[Variant]:
    """The unfused decode conv (fused_decode=off, and the buckets the fused GDN layer does not
    take)."""
    kernel = gdn_decode._conv_decode_kernel
    types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "pool_ptr": "*bf16", "slots_ptr": "*i64",
             "y_ptr": "*bf16"}
    types |= {arg: "i32" for arg in kernel.arg_names
              if arg.startswith("stride_") or arg in ("channels", "width")}
    width = triton.next_power_of_2(config.linear_conv_kernel_dim)
    return [Variant("gdn decode conv", kernel, types,
                    {"BLOCK_C": gdn_decode.CONV_BLOCK_C, "BLOCK_W": width,
                     "COMPUTE": triton.language.float32}, gdn_decode.CONV_NUM_WARPS)]


def _conv_varlen_variants(config: ModelConfig) -> list[Variant]:
    """The prefill's GDN conv (not a decode kernel, but on the same path to the GPU)."""
    width = config.linear_conv_kernel_dim
    strides = ("stride_xt", "stride_xc", "stride_pn", "stride_pc", "stride_pw", "channels")
    pointers = {"x_ptr": "*bf16", "pool_ptr": "*bf16", "slots_ptr": "*i64", "qsl_ptr": "*i64"}
    state = Variant("prefill conv state", conv_varlen._conv_state_kernel,
                    pointers | {name: "i32" for name in strides},
                    {"WIDTH": width, "BLOCK_W": triton.next_power_of_2(width),
                     "BLOCK_C": conv_varlen.STATE_BLOCK_C}, conv_varlen.CONV_NUM_WARPS)
    kernel = conv_varlen._conv_varlen_kernel
    types = pointers | {"w_ptr": "*bf16", "seq_ptr": "*i64", "y_ptr": "*bf16", "eps": "fp32"}
    types |= {arg: "i32" for arg in kernel.arg_names
              if arg.startswith("stride_") or arg in ("num_tokens", "channels", "key_width",
                                                      "value_width", "head_dim")}
    conv = Variant("prefill conv + q/k l2norm", kernel, types, {
        "WIDTH": width, "BLOCK_T": conv_varlen.CONV_BLOCK_T,
        "BLOCK_C": triton.next_power_of_2(config.linear_key_head_dim),
        "COMPUTE": triton.language.float32, "L2NORM_QK": True}, conv_varlen.CONV_NUM_WARPS)
    return [conv, state]


def _chunk_states_variants(config: ModelConfig) -> list[Variant]:
    """The prefill's delta rule state pass: every config its autotuner may pick. Most spill
    (8 bytes to 17 KB a thread at 0.8B), as fla's kernel it replaces does at the same configs
    (12 bytes to 16 KB); the autotuner times them, so the check is that each compiles and fits
    in shared memory."""
    pointers = ("k_ptr", "u_ptr", "w_ptr", "v_new_ptr", "h_ptr")
    types = {name: "*bf16" for name in pointers} | {
        "g_ptr": "*fp32", "state_ptr": "*fp32", "slots_ptr": "*i64", "cu_ptr": "*i64",
        "offsets_ptr": "*i64"}
    shape = {"H": config.linear_num_key_heads, "HV": config.linear_num_value_heads,
             "K": config.linear_key_head_dim, "V": config.linear_value_head_dim, "BT": 64,
             "WHILE_LOOP": False}
    return [Variant(f"prefill chunk states BV={tuned.kwargs['BV']} {tuned.num_warps} warps "
                    f"{tuned.num_stages} stages", chunk_states._chunk_states_kernel, types,
                    shape | tuned.kwargs, tuned.num_warps, tuned.num_stages,
                    allowed_spill=1 << 20)
            for tuned in chunk_states.TUNING_CONFIGS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3.5-0.8b")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: unset TRITON_INTERPRET (the kernels must be JIT functions)",
              file=sys.stderr)
        return 2
    target = GPUTarget("cuda", args.arch, 32)
    failed = 0
    for variant in decode_variants(load_model_config(args.model)):
        try:
            compiled = variant.compile(target)
            registers, spilled = ptxas_usage(compiled.asm["ptx"], args.arch)
        except Exception as error:  # a compiler error names the kernel, then we go on
            failed += 1
            print(f"FAIL {variant.name}: {type(error).__name__}: {error}", flush=True)
            continue
        shared = compiled.metadata.shared
        verdict = ("TOO MUCH SHARED MEMORY" if shared > HOPPER_SHARED_BYTES
                   else "SPILLS" if spilled > variant.allowed_spill else "ok")
        failed += verdict != "ok"
        print(f"{verdict:>4} {variant.name}: {shared} bytes shared, {registers} registers, "
              f"{spilled} bytes spilled", flush=True)
    return 1 if failed else 0


def ptxas_usage(ptx: str, arch: int) -> tuple[int, int]:
    """(registers per thread, bytes of spill stores) that ptxas reports for the kernel."""
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "kernel.ptx"
        source.write_text(ptx)
        report = subprocess.run([get_ptxas(arch).path, "-v", f"-arch={gpu}", str(source), "-o",
                                 str(source.with_suffix(".cubin"))],
                                capture_output=True, text=True, check=True).stderr
    registers = re.search(r"Used (\d+) registers", report)
    spilled = re.search(r"(\d+) bytes spill stores", report)
    if registers is None or spilled is None:
        raise RuntimeError(f"no register report from ptxas: {report!r}")
    return int(registers.group(1)), int(spilled.group(1))


if __name__ == "__main__":
    sys.exit(main())
