"""EngineConfig: the engine's knobs.

Precedence, lowest first: the defaults here, the model YAML's `engine:` mapping, `RESIDENT_<KNOB>`
environment variables (a knob already named `resident_*` keeps one prefix: `resident_planning`
reads `RESIDENT_PLANNING`), then `--set knob=value`. List knobs take commas
(`--set decode_buckets=1,2,4`). An unknown knob or a bad value fails at start, naming it.
Knobs left at 0 or `auto` are sized by `EngineConfig.resolve` from the model and the device
type, once: `resident serve` resolves before it starts anything and hands the resolved config to
the engine core; an Engine is built from a resolved config.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from resident.eventloop import EVENT_LOOPS
from resident.eventloop import resolve as resolve_event_loop
from resident.info import gdn_conv_bytes, gdn_recurrent_bytes
from resident.interpreter import triton_interpreting
from resident.model.config import ModelConfig

DEFAULT_DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
SMALLEST_PREFILL_BUCKET = 128  # auto prefill buckets: powers of two from here
CPU_KV_PAGES = 4096
MAX_AUTO_SNAPSHOTS = 64  # prefix_snapshots=0 fills prefix_snapshot_gib up to this many
MAX_DEFAULT_MODEL_LEN = 32768

_CHOICES = {
    "dtype": ("auto", "bfloat16", "float16", "float32", "float64"),
    "gdn_state_dtype": ("auto", "bfloat16", "float32", "float64"),
    "decode_order": ("arrival", "turns"),
    "resident_planning": ("off", "auto"),
    "row_check": ("off", "on"),
    "phase_timing": ("off", "on"),
    "plan_ahead": ("off", "on", "launch"),
    "late_launch": ("auto", "on", "off"),
    "attention_backend": ("auto", "flashinfer", "triton", "torch"),
    "cuda_graphs": ("auto", "on", "off"),
    "padded_prefill": ("auto", "on", "off"),
    "compile": ("auto", "on", "off"),
    "decode_gemm": ("skinny", "wide", "fused", "cublas"),
    "fused_decode": ("auto", "full", "off"),
    "pdl": ("auto", "off"),
    "prefix_cache": ("off", "on"),
    "prefix_snapshot_tail": ("off", "on"),
    "sampler": ("auto", "torch", "flashinfer", "triton"),
    "argmax": ("auto", "torch", "triton"),
    "token_ring": ("on", "off"),
    "varlen_splits": ("off", "auto"),
    "decode_splits": ("off", "auto"),
    "event_loop": EVENT_LOOPS,
    "core_idle_spin": ("auto", "on", "off"),
}


@dataclass(frozen=True)
class EngineConfig:
    """Engine knobs; see the module docstring for where values come from."""

    dtype: str = "auto"
    # what the GDN recurrent state is stored in (its slots, prefix snapshots and swaps; every
    # kernel computes in fp32 whatever it is): auto is float32 (float64 in a float64 model), as
    # Qwen3.5's checkpoints declare (`mamba_ssm_dtype`) and vLLM follows. bfloat16 halves the
    # state's bytes, which are most of what a large decode step moves (2 x 18 MiB a sequence at
    # 0.8B), at the cost of rounding the state once a token (vLLM's --mamba-ssm-cache-dtype,
    # SGLang's --mamba-ssm-dtype)
    gdn_state_dtype: str = "auto"
    page_size: int = 16
    num_kv_pages: int = 0  # 0: 4096 on CPU; sized from kv_cache_gib on CUDA
    kv_cache_gib: float = 16.0  # a device's; under tensor_parallel each rank's
    max_model_len: int = 0  # 0: min(max_position_embeddings, 32768)
    max_num_seqs: int = 256
    num_state_slots: int = 0  # 0: max_num_seqs plus the sink
    prefill_token_budget: int = 2048
    decode_buckets: tuple[int, ...] = DEFAULT_DECODE_BUCKETS
    decode_order: str = "arrival"
    resident_planning: str = "auto"
    row_check: str = "off"  # debug: sync after each resident step and compare rows with streams
    phase_timing: str = "off"  # ms per step of each phase at GET /debug/phases (phases.py)
    # on: schedule and stage step N+1 while step N runs on the GPU, before N's tokens are read
    # back; launch: also launch a decode step N+1 before that read-back, its token ids gathered
    # from N's sampled tokens on the device (engine.py); the H200's decode step is then the
    # GPU's (results/2026-11-30-h200-0.8b-ahead)
    plan_ahead: str = "launch"
    # on (plan_ahead=launch, one rank): the step after a decode step is launched late in that
    # step's GPU time, the engine core polling its request pipe until then, so a request that
    # arrives meanwhile runs its prompt in that step, not the one after (a decode step less of
    # TTFT for those; engine/launch_window.py). The API's other messages keep to the step's
    # boundary. auto: on on CUDA under plan_ahead=launch on one rank, else off (on CPU the
    # forward runs inside its launch and no window opens). On an H100 a prefix hit's TTFT p50
    # fell 7.33 -> 6.80 ms at c=16 and 8.75 -> 8.16 at c=64 open loop, closed-loop tok/s
    # +0.2% [-0.7, +1.1] and +0.6% [-2.2, +3.5] over 6 rounds
    # (results/2026-12-07-h100-late-launch)
    late_launch: str = "auto"
    attention_backend: str = "auto"  # decode attention; auto: triton on CUDA, torch on CPU
    cuda_graphs: str = "auto"  # one graph per decode bucket; auto: on for CUDA
    # every prefill and mixed step runs padded to the smallest prefill bucket (tokens) that
    # holds it, its rows at a fixed capacity, on kernels that need no host plan: fixed shapes,
    # so under cuda_graphs each bucket is a captured graph (engine/inputs.py). auto: on for CUDA.
    # off: varlen steps run eager on the prefill backend's host-planned kernels.
    padded_prefill: str = "auto"
    # token buckets of padded steps; empty: powers of two from 128 below the largest step, which
    # is always the last bucket: prefill_token_budget plus the widest decode bucket's rows
    prefill_buckets: tuple[int, ...] = ()
    max_prefill_rows: int = 16  # prefill chunks a step takes at most (its decode rows apart)
    compile: str = "auto"  # torch.compile of the dense parts; auto: on for CUDA
    # projections of decode buckets <= 16 rows under triton and flashinfer: the narrow ones on
    # the skinny Triton GEMM with the elementwise op before it apart (skinny), the wide ones
    # there too (wide), the op in its prologue (fused: slower on the H200,
    # results/2026-11-29-h200-0.8b-fusions), or all on cuBLAS
    decode_gemm: str = "skinny"
    # a bench_gemv --json file measured on this GPU: under decode_gemm skinny or wide, each
    # projection of a bucket of <= 64 rows runs on what it timed fastest there, Triton tile or
    # cuBLAS (backends/gemv_table.py); auto: configs/gemv/<the GPU's name>.json where one was
    # measured and committed, else decode_gemm's rule (cuBLAS above 16 rows); off: the rule
    gemv_table: str = "auto"
    # decode buckets under triton and flashinfer: a GDN layer's conv, gates, delta rule and
    # output norm in one kernel, an attention layer's q/k norm, RoPE and KV write in one
    # (kernels/gdn_layer_decode.py, attention_prologue.py); off: the separate kernels
    fused_decode: str = "auto"
    # programmatic dependent launch between the decode step's Triton kernels and Inductor's
    # where the GPU has it (Hopper on): each starts while the one before finishes
    # (kernels/pdl.py)
    pdl: str = "auto"
    # a new request starts from the longest cached prefix of its prompt: its KV pages shared,
    # its GDN state restored from a snapshot (engine/prefix.py). A prefill chunk is cut only
    # where a later request restores: where another request's cached pages of the prompt end
    # (a prompt nobody shared is never cut); one that ends on its own every
    # prefix_snapshot_interval pages snapshots too. prefix_snapshot_tail on cuts every prompt at
    # its last page boundary (a repeat restores there from its second request, not its third;
    # a step more for every prompt); prefix_snapshots device snapshots at most, LRU replaced.
    # On by default since the cuts follow sharing: without it the cache costs no step
    # (results/2026-12-04-h200-prefix-seen)
    prefix_cache: str = "on"
    prefix_snapshot_interval: int = 32
    prefix_snapshot_tail: str = "off"
    # 0: as many as prefix_snapshot_gib holds on each device, MAX_AUTO_SNAPSHOTS at most (a
    # snapshot is one sequence's GDN state: ~18 MiB at 0.8B, ~150 MiB at 27B, so a count alone
    # would spend 1 GiB on one model and 10 on another)
    prefix_snapshots: int = 0
    prefix_snapshot_gib: float = 2.0
    # the batched draw (engine/draw.py): torch (a filter by one sort of the batch), flashinfer
    # (its mask and renorm kernels, no sort; CUDA) or triton (kernels/nucleus_race.py: a
    # rejection race, no filter pass; CUDA); auto: triton on CUDA (it passed the H200's sampler
    # tests in a captured draw and is 11x faster than torch at 64 rows), torch elsewhere
    sampler: str = "auto"
    # each row's greedy token (the decode graph's argmax, a varlen step's greedy rows): torch's
    # reduction, or a [rows, blocks] Triton kernel that spreads a row over the GPU
    # (kernels/argmax.py; CUDA, or TRITON_INTERPRET=1 for tests); auto: triton on CUDA (2.4-3x
    # torch's at 1-64 rows, results/2026-12-05-h100-argmax), torch elsewhere
    argmax: str = "auto"
    # a decode step's graph stores its tokens into pinned host memory as its last kernel
    # (engine/token_ring.py), so their read-back queues no device-to-host copy (~10 µs of host
    # time a step on the H100 hosts); off: the copy
    token_ring: str = "on"
    # the padded prefill and mixed steps' attention (kernels/varlen_attention.py) with each
    # query block's keys split over programs where the grid is short of the SMs (auto), merged
    # by the last split in the same kernel; off: one program a query block walks all its keys.
    # On the H200 a 256-token prefix hit over 1,024 keys took 116 µs a layer with one program
    # a block, 49 split 3 ways (auto), and beside 16 decode rows 142 against 81 split 2 ways
    # (results/2026-12-06-h200-sampled-varlen)
    varlen_splits: str = "auto"
    # the Triton decode attention's keys split over as many programs a (row, kv head) as give
    # a small bucket's grid twice as many programs as SMs, 8 to 64, and a wide bucket half the
    # tile and four times the SMs' programs, 1 to 8 splits (auto:
    # kernels/decode_attention.decode_tile); off: 8 splits of the kernel's own tile in every
    # bucket. On an H100 at c=1 a layer took 8.4 -> 6.4 µs over 560 keys and 29.1 -> 8.6 over
    # 4,096 (results/2026-12-06-h100-decode-splits); at 256 rows 150.8 -> 120.8 over 640
    # (results/2026-12-07-h100-decode-tiles)
    decode_splits: str = "auto"
    api_core: str = ""  # CPU list for the API process, e.g. "3" or "0-1"; empty: not pinned
    # CPU list for the engine core's step thread; auto: two of the process's allowed CPUs
    # outside api_core (step_cores in core.py); empty: not pinned
    step_thread_cores: str = ""
    # on: an engine core out of work polls for the API's next message without waiting for
    # core.IDLE_SPIN_S before it sleeps in a wait, so a request arriving then is taken at once,
    # not after its thread wakes: on an H100 host a message reached a process waiting in zmq's
    # poll in 0.31 ms (p50), one polling without a wait in 0.12, and served at c=1 TTFT p50 fell
    # 5.48 -> 5.33 ms (results/2026-12-06-h100-hit-path). auto: on on CUDA; off on CPU, where
    # the core's spin would take a CPU the forward, the API and the clients share
    core_idle_spin: str = "auto"
    # the engine core's young-generation GC threshold (gc.set_threshold's first; Python's
    # own is 700): a c=256 step leaves a few hundred short-lived containers alive at once, so
    # at 700 the core collected about every other step, 0.9-1.1% of its wall at c=256 on an
    # H100; at 20,000 it ran none there, and served tok/s did not move within two rounds (the
    # pauses sat under the GPU's step; results/2026-12-07-h100-gc-young)
    gc_young_threshold: int = 20_000
    seed: int = 0  # seeds sampling for requests that bring no seed
    # the HTTP API's limits (server/api.py, server/serve.py; docs/engine.md "Limits and failures")
    max_waiting: int = 1024  # requests in flight past max_num_seqs before new ones get a 429
    max_body_mib: float = 8.0  # a request body's cap (413), checked before it is read
    request_timeout_s: float = 600.0  # a request's whole generation (then 504); 0: none
    read_timeout_s: float = 10.0  # a request's headers, and then its body, arrive within it
    shutdown_grace_s: float = 5.0  # on SIGTERM in-flight requests drain this long, then abort
    core_stall_s: float = 60.0  # the core silent this long (dead or stuck): fail and exit
    # the core silent this long: /health answers 503 "stalled" (it may recover; the exit still
    # waits for core_stall_s, which caps this)
    health_stall_s: float = 5.0
    # the listener (server/connections.py): connections open at once; 0: the descriptor limit
    # less 64, up to 16384 (checked against the limit at start)
    max_connections: int = 0
    keepalive_timeout_s: float = 5.0  # a connection idle this long after a response is closed
    send_stall_s: float = 30.0  # a stream its client leaves unread this long: dropped, aborted
    # a connection's kernel send buffer (SO_SNDBUF) and the API's own buffer above it: small, so
    # a client that stops reading fills them within seconds and send_stall_s can see it
    send_buffer_kib: int = 64
    # a stream's tokens after its first leave the engine core this many at a time (its first
    # and last at once), vLLM's and SGLang's stream_interval: each write to a client and each
    # wake-up it causes is a system call whatever it carries, so the API's CPU a token falls as
    # this rises, and tokens arrive in groups (results/2026-12-05-cpu-token-event)
    stream_interval: int = 1
    # the API processes' asyncio loop (eventloop.py): auto and uvloop run uvloop (where it is
    # installed). asyncio's by default: on H100 hosts uvloop took the API's CPU a token 5-9%
    # lower in three sessions, and its server read 0.5-1.5% fewer tok/s at c=64 in each, no
    # verdict (results/2026-12-06-h100-event-loop, 2026-12-06-h100-hit-path)
    event_loop: str = "asyncio"
    profile_dir: str = ""  # where POST /debug/profile writes traces; empty: <tmp>/resident-profiles
    # ranks the model is split over (Megatron-style, docs/parallel.md): one engine-core process
    # a rank, each on its own device (rank r on CUDA device r of the visible ones); must divide
    # the model's attention, KV and GDN heads and its MLP intermediate size
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        for knob, choices in _CHOICES.items():
            if getattr(self, knob) not in choices:
                raise ValueError(f"knob {knob}: {getattr(self, knob)!r} is not one of "
                                 f"{', '.join(choices)}")
        for knob in ("page_size", "max_num_seqs", "prefill_token_budget", "max_prefill_rows",
                     "send_buffer_kib", "prefix_snapshot_interval", "tensor_parallel",
                     "stream_interval", "gc_young_threshold"):
            if getattr(self, knob) < 1:
                raise ValueError(f"knob {knob}: must be >= 1, got {getattr(self, knob)}")
        for knob in ("num_kv_pages", "max_model_len", "num_state_slots", "max_waiting",
                     "request_timeout_s", "max_connections", "prefix_snapshots"):
            if getattr(self, knob) < 0:
                raise ValueError(f"knob {knob}: must be >= 0, got {getattr(self, knob)}")
        for knob in ("max_body_mib", "read_timeout_s", "shutdown_grace_s", "core_stall_s",
                     "health_stall_s", "keepalive_timeout_s", "send_stall_s",
                     "prefix_snapshot_gib"):
            if not getattr(self, knob) > 0:
                raise ValueError(f"knob {knob}: must be > 0, got {getattr(self, knob)}")
        if self.page_size & (self.page_size - 1):
            raise ValueError(f"knob page_size: must be a power of two, got {self.page_size}")
        if self.num_kv_pages == 1:
            raise ValueError("knob num_kv_pages: needs at least 2 (page 0 is the sink)")
        if self.num_state_slots == 1:
            raise ValueError("knob num_state_slots: needs at least 2 (slot 0 is the sink)")
        if self.kv_cache_gib <= 0:
            raise ValueError(f"knob kv_cache_gib: must be > 0, got {self.kv_cache_gib}")
        if self.late_launch == "on" and (self.plan_ahead != "launch" or self.tensor_parallel > 1):
            raise ValueError("knob late_launch: on needs plan_ahead=launch and one rank "
                             f"(plan_ahead={self.plan_ahead}, tensor_parallel="
                             f"{self.tensor_parallel}): a follower rank replays intake only at "
                             "a step's boundary")
        if self.gemv_table not in ("auto", "off") and self.decode_gemm not in ("skinny", "wide"):
            raise ValueError(f"knob gemv_table: picks kernels under decode_gemm skinny or wide, "
                             f"not {self.decode_gemm}")
        _check_buckets("decode_buckets", self.decode_buckets, allow_empty=False)
        _check_buckets("prefill_buckets", self.prefill_buckets, allow_empty=True)
        parse_cpu_list(self.api_core, "api_core")
        if self.event_loop == "uvloop":  # refused here, by name, where it is not installed
            resolve_event_loop(self.event_loop)
        if self.step_thread_cores != "auto":
            parse_cpu_list(self.step_thread_cores, "step_thread_cores")

    @property
    def max_decode_rows(self) -> int:
        return self.decode_buckets[-1]

    @property
    def max_step_rows(self) -> int:
        """The most rows (requests) one step can hold, decode or varlen."""
        return self.max_decode_rows + self.max_prefill_rows

    @property
    def max_step_tokens(self) -> int:
        """The most tokens one step can hold: a full prefill budget and a decode row each."""
        return self.prefill_token_budget + self.max_decode_rows

    def changed(self) -> dict[str, Any]:
        """Knobs that differ from the defaults."""
        return self.changed_from(EngineConfig())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def is_resolved(self) -> bool:
        """Every auto knob filled (resolve): what an Engine is built from."""
        return "auto" not in (self.dtype, self.gdn_state_dtype, self.attention_backend,
                              self.cuda_graphs, self.padded_prefill, self.compile, self.sampler,
                              self.core_idle_spin, self.late_launch) \
            and min(self.max_model_len, self.num_kv_pages, self.num_state_slots,
                    self.prefix_snapshots) > 0

    def resolve(self, model: ModelConfig, device_type: str) -> EngineConfig:
        """The one place knobs left at 0 or `auto` are filled, from the model and the device
        type (cpu or cuda); fails naming a knob that cannot fit them. Idempotent: a resolved
        config resolves to itself."""
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"device {device_type!r} is not cpu or cuda")
        max_len = self.max_model_len or min(model.max_position_embeddings, MAX_DEFAULT_MODEL_LEN)
        if max_len > model.max_position_embeddings:
            raise ValueError(f"knob max_model_len: {max_len} exceeds the model's "
                             f"max_position_embeddings {model.max_position_embeddings}")
        check_tensor_parallel(self.tensor_parallel, model)
        dtype = _resolve_dtype(self.dtype, device_type)
        state_dtype = resolve_state_dtype(self.gdn_state_dtype, dtype, device_type)
        padded = _on_for_cuda(self.padded_prefill, device_type)
        backend = self.attention_backend
        if backend == "auto":
            backend = "triton" if device_type == "cuda" else "torch"
        return dataclasses.replace(
            self,
            dtype=dtype,
            gdn_state_dtype=state_dtype,
            max_model_len=max_len,
            num_kv_pages=self.num_kv_pages or _auto_kv_pages(self, model, dtype, device_type),
            num_state_slots=self.num_state_slots or self.max_num_seqs + 1,
            prefix_snapshots=num_prefix_snapshots(self, model, dtype),
            attention_backend=backend,
            cuda_graphs=_resolve_graphs(self.cuda_graphs, backend, device_type),
            padded_prefill=padded,
            prefill_buckets=self._token_buckets() if padded == "on" else (),
            compile=_on_for_cuda(self.compile, device_type),
            sampler=_resolve_sampler(self.sampler, device_type),
            core_idle_spin=_on_for_cuda(self.core_idle_spin, device_type),
            late_launch=self._late_launch(device_type),
            argmax=_resolve_argmax(self.argmax, device_type, dtype),
        )

    def _late_launch(self, device_type: str) -> str:
        """auto: on where a window can open (CUDA, plan_ahead=launch, one rank)."""
        if self.late_launch != "auto":
            return self.late_launch
        able = self.plan_ahead == "launch" and self.tensor_parallel == 1
        return "on" if able and device_type == "cuda" else "off"

    def _token_buckets(self) -> tuple[int, ...]:
        """The prefill buckets below the largest step, then the largest step."""
        top = self.max_step_tokens
        buckets = self.prefill_buckets
        if not buckets:
            buckets = tuple(SMALLEST_PREFILL_BUCKET << i for i in range(top.bit_length()))
        return tuple(b for b in buckets if b < top) + (top,)

    def changed_from(self, default: EngineConfig) -> dict[str, Any]:
        """Knobs whose value differs from `default`'s."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


def _resolve_dtype(name: str, device_type: str) -> str:
    """`auto` is bfloat16 on CUDA and float32 on CPU; float64 only on CPU."""
    if name == "auto":
        return "bfloat16" if device_type == "cuda" else "float32"
    if name == "float64" and device_type != "cpu":
        raise ValueError("knob dtype: float64 is for exact tests on CPU only")
    return name


def kv_bytes_per_page(model: ModelConfig, page_size: int, dtype: str) -> int:
    """K and V of every attention layer for one page of tokens."""
    return (len(model.attention_layers) * 2 * page_size * model.num_key_value_heads
            * model.head_dim * DTYPE_BYTES[dtype])


def resolve_state_dtype(knob: str, dtype: str, device_type: str = "cpu") -> str:
    """gdn_state_dtype's value for a model of `dtype`: auto is float32, float64 in a float64
    model (EngineConfig.gdn_state_dtype; kernels.compute_dtype's rule, here on the knobs'
    names: the config is read before torch is imported); float64 only on CPU."""
    if knob == "auto":
        return "float64" if dtype == "float64" else "float32"
    if knob == "float64" and device_type != "cpu":
        raise ValueError("knob gdn_state_dtype: float64 is for exact tests on CPU only")
    return knob


def snapshot_bytes(model: ModelConfig, dtype: str, tensor_parallel: int = 1,
                   state_dtype: str = "auto") -> int:
    """One prefix-cache snapshot on one rank: a sequence's GDN conv window (in `dtype`) and
    recurrent state (in gdn_state_dtype's, `state_dtype` as the knob gives it), a rank holding
    its share of the GDN heads."""
    state = DTYPE_BYTES[resolve_state_dtype(state_dtype, dtype)]
    return (gdn_conv_bytes(model, DTYPE_BYTES[dtype])
            + gdn_recurrent_bytes(model, state)) // tensor_parallel


def num_prefix_snapshots(config: EngineConfig, model: ModelConfig, dtype: str) -> int:
    """The knob prefix_snapshots, or at 0 as many snapshots as prefix_snapshot_gib holds on
    each device, MAX_AUTO_SNAPSHOTS at most."""
    if config.prefix_snapshots:
        return config.prefix_snapshots
    each = snapshot_bytes(model, dtype, config.tensor_parallel, config.gdn_state_dtype)
    count = int(config.prefix_snapshot_gib * 2**30) // each
    if count < 1:
        raise ValueError(f"knob prefix_snapshot_gib: {config.prefix_snapshot_gib} GiB holds no "
                         f"GDN state snapshot of {model.name!r} ({each} bytes each)")
    return min(count, MAX_AUTO_SNAPSHOTS)


def _auto_kv_pages(config: EngineConfig, model: ModelConfig, dtype: str, device_type: str) -> int:
    """CPU_KV_PAGES on CPU; on CUDA as many pages as kv_cache_gib holds on each device (a
    tensor-parallel rank's page holds its share of the KV heads)."""
    if device_type == "cpu":
        return CPU_KV_PAGES
    page_bytes = kv_bytes_per_page(model, config.page_size, dtype) // config.tensor_parallel
    pages = int(config.kv_cache_gib * 2**30) // page_bytes
    if pages < 2:
        raise ValueError(f"knob kv_cache_gib: {config.kv_cache_gib} GiB holds {pages} KV pages; "
                         f"needs at least 2 (page 0 is the sink)")
    return pages


def check_tensor_parallel(ranks: int, model: ModelConfig) -> None:
    """Every split dimension must divide by the ranks: each rank owns whole heads (a head's
    query, key and value, and its gate, stay on one rank, so attention and the GDN recurrence
    need no communication) and an equal share of the MLP's intermediate channels."""
    sizes = {"num_attention_heads": model.num_attention_heads,
             "num_key_value_heads": model.num_key_value_heads,
             "linear_num_key_heads": model.linear_num_key_heads,
             "linear_num_value_heads": model.linear_num_value_heads,
             "intermediate_size": model.intermediate_size}
    for name, size in sizes.items():
        if size % ranks:
            raise ValueError(f"knob tensor_parallel: {ranks} does not divide {name} ({size}) "
                             f"of model {model.name!r}")


def _check_buckets(knob: str, buckets: tuple[int, ...], allow_empty: bool) -> None:
    if ((not buckets and not allow_empty) or any(b < 1 for b in buckets)
            or list(buckets) != sorted(set(buckets))):
        raise ValueError(f"knob {knob}: must be increasing positive ints, got "
                         f"{','.join(map(str, buckets)) or 'nothing'}")


def _on_for_cuda(knob: str, device_type: str) -> str:
    """An on|off|auto knob's value: auto is on on CUDA, off on CPU."""
    if knob != "auto":
        return knob
    return "on" if device_type == "cuda" else "off"


def _resolve_sampler(knob: str, device_type: str) -> str:
    """auto: triton on CUDA, else torch (see EngineConfig.sampler); flashinfer (installed)
    and triton only on CUDA."""
    if knob in ("flashinfer", "triton") and device_type != "cuda":
        raise ValueError(f"knob sampler: {knob} needs a CUDA device")
    if knob == "flashinfer" and importlib.util.find_spec("flashinfer") is None:
        raise ValueError("knob sampler: flashinfer is not installed")
    if knob == "auto":
        return "triton" if device_type == "cuda" else "torch"
    return knob


def _resolve_argmax(knob: str, device_type: str, dtype: str) -> str:
    """auto: triton on CUDA, else torch (see EngineConfig.argmax); triton on CPU only under
    the interpreter, and never for float64 logits (the kernel compares in float32)."""
    if knob == "auto":
        return "triton" if device_type == "cuda" else "torch"
    if knob == "triton" and device_type != "cuda" and not triton_interpreting():
        raise ValueError("knob argmax: triton needs a CUDA device (or TRITON_INTERPRET=1 for "
                         "tests)")
    if knob == "triton" and dtype == "float64":
        raise ValueError("knob argmax: triton compares in float32; a float64 model takes "
                         "torch's argmax")
    return knob


def _resolve_graphs(knob: str, backend: str, device_type: str) -> str:
    if device_type != "cuda":
        if knob == "on":
            raise ValueError("knob cuda_graphs: on needs a CUDA device")
        if backend == "flashinfer":
            raise ValueError("knob attention_backend: flashinfer needs a CUDA device")
        if backend == "triton" and not triton_interpreting():
            raise ValueError("knob attention_backend: triton needs a CUDA device (or "
                             "TRITON_INTERPRET=1 for tests)")
        return "off"
    if backend == "torch":
        if knob == "on":
            raise ValueError("knob cuda_graphs: on cannot go with attention_backend=torch: the "
                             "reference reads every key a full-width block table names; use "
                             "triton or flashinfer")
        return "off"
    return "on" if knob == "auto" else knob


def parse_cpu_list(text: str, knob: str) -> list[int]:
    """"0-3,8" -> [0, 1, 2, 3, 8]; empty -> []."""
    cpus: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            low, _, high = part.partition("-")
            cpus.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise ValueError(f"knob {knob}: {text!r} is not a CPU list like 0-3,8") from None
    if any(cpu < 0 for cpu in cpus):
        raise ValueError(f"knob {knob}: {text!r} names a negative CPU")
    return cpus


def env_name(knob: str) -> str:
    return knob.upper() if knob.startswith("resident_") else f"RESIDENT_{knob.upper()}"


def _parse(knob: str, raw: Any) -> Any:
    field_type = {f.name: f.type for f in dataclasses.fields(EngineConfig)}[knob]
    try:
        if field_type == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if field_type == "float":
            return float(raw)
        if field_type.startswith("tuple"):
            items = raw.split(",") if isinstance(raw, str) else list(raw)
            return tuple(int(item) for item in items if str(item).strip())
        return str(raw)
    except (TypeError, ValueError):
        raise ValueError(f"knob {knob}: {raw!r} is not a valid {field_type}") from None


def build_engine_config(
    model_yaml_knobs: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> EngineConfig:
    """Applies the layers in precedence order; unknown knobs in YAML or overrides fail."""
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    values: dict[str, Any] = {}
    for source, layer in (("model YAML engine", model_yaml_knobs or {}),
                          ("--set", overrides or {})):
        for knob in layer:
            if knob not in known:
                raise ValueError(f"unknown knob {knob!r} (from {source}); knobs are: "
                                 f"{', '.join(sorted(known))}")
    values.update({k: _parse(k, v) for k, v in (model_yaml_knobs or {}).items()})
    environ = os.environ if environ is None else environ
    for knob in known:
        if env_name(knob) in environ:
            values[knob] = _parse(knob, environ[env_name(knob)])
    values.update({k: _parse(k, v) for k, v in (overrides or {}).items()})
    return EngineConfig(**values)


def parse_set_options(options: list[str]) -> dict[str, str]:
    """["knob=value", ...] -> {knob: value}; a malformed one fails naming it."""
    parsed = {}
    for option in options:
        knob, sep, value = option.partition("=")
        if not sep or not knob.strip():
            raise ValueError(f"--set {option!r}: expected knob=value")
        parsed[knob.strip()] = value.strip()
    return parsed


def model_yaml_knobs(model: str) -> dict[str, Any]:
    """The `engine:` mapping of a shipped or given model YAML; empty for checkpoint dirs."""
    from resident.model.config import configs_dir

    path = Path(model)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = configs_dir() / "models" / f"{model}.yaml"
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    knobs = data.get("engine") or {}
    if not isinstance(knobs, dict):
        raise ValueError(f"{path}: engine must be a mapping of knobs")
    return knobs


def check_knobs_for_model(model: str, device: str, overrides: Mapping[str, str]) -> None:
    """Resolves `overrides` over the model YAML's knobs for `model` on `device`, so a caller
    that launches the engine elsewhere fails first with the engine's own ValueError."""
    from resident.model.config import load_model_config

    build_engine_config(model_yaml_knobs(model), None, overrides).resolve(
        load_model_config(model), device)
