"""The `resident` command line: one function per command, options defined once."""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Iterable
from typing import Annotated, Any

import typer

from resident.cli_flags import NO_BUILTIN_HELP, HelpOpt, version_option
from resident.config import (
    _CHOICES,
    EngineConfig,
    build_engine_config,
    env_name,
    model_yaml_knobs,
    num_prefix_snapshots,
    parse_cpu_list,
    parse_set_options,
    snapshot_bytes,
)
from resident.info import model_facts
from resident.model.config import load_model_config
from resident.render import OutputFormat, render

# every command, and the callback, takes HelpOpt (cli_flags.py)
app = typer.Typer(no_args_is_help=True, add_completion=False, context_settings=NO_BUILTIN_HELP,
                  help="resident: a Qwen3.5 serving engine with decode planning on the GPU.")


def _choices(values: Iterable[str]) -> str:
    """A metavar naming the allowed values: [a|b|c]."""
    return f"[{'|'.join(values)}]"


def _ranged(help_text: str, low: float, high: float | None = None) -> dict[str, Any]:
    """help and callback for a number kept in [low, high], the range written into the help at
    {range}: in place of typer's min/max, which print a Python comparison after the metavar."""
    span = f"{low}-{high}" if high is not None else f"at least {low}"

    def check(value: float) -> float:
        if value < low or (high is not None and value > high):
            raise typer.BadParameter(f"must be {span}, not {value}")
        return value

    return {"help": help_text.format(range=span), "callback": check}


class Device(enum.StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_STATE_DTYPES = ("float32", "bfloat16")

# hidden: typer lists an argument with its Python type (<str>); the usage line shows {MODEL}
# and each command's help says what it is
ModelArg = Annotated[str, typer.Argument(metavar="MODEL", hidden=True)]
FormatOpt = Annotated[OutputFormat, typer.Option(
    "--format", metavar=_choices(OutputFormat), help="How the results print.")]
VersionOpt = version_option("resident")


@app.callback()
def _root(
    version: VersionOpt = False,
    show_help: HelpOpt = False,
) -> None:
    """resident: a Qwen3.5 serving engine with decode planning on the GPU."""


def _model_config(model: str):
    try:
        return load_model_config(model)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="MODEL") from None


@app.command()
def info(
    model: ModelArg,
    context: Annotated[int, typer.Option(
        "--context", metavar="INT",
        **_ranged("Tokens of KV each sequence reads, {range}.", 0))] = 640,
    bandwidth: Annotated[float, typer.Option(
        "--bandwidth", metavar="FLOAT",
        **_ranged("Memory bandwidth in TB/s, {range} (4.28: the H200's measured copy "
                  "bandwidth).", 0.001))] = 4.28,
    dtype: Annotated[str, typer.Option(
        "--dtype", metavar=_choices(_DTYPE_BYTES), help="Weight and KV dtype.")] = "bfloat16",
    gdn_state_dtype: Annotated[str, typer.Option(
        "--gdn-state-dtype", metavar=_choices(_STATE_DTYPES),
        help="The GDN recurrent state's dtype (knob gdn_state_dtype).")] = "float32",
    prefix_snapshots: Annotated[int, typer.Option(
        "--prefix-snapshots", metavar="INT",
        **_ranged("GDN state snapshots of the prefix cache (knob prefix_snapshots; 0: what "
                  "--prefix-snapshot-gib holds, 64 at most), {range}.",
                  0))] = EngineConfig.prefix_snapshots,
    prefix_snapshot_gib: Annotated[float, typer.Option(
        "--prefix-snapshot-gib", metavar="FLOAT",
        **_ranged("The snapshot pool's budget when --prefix-snapshots is 0 (knob "
                  "prefix_snapshot_gib), {range}.", 0.001))] = EngineConfig.prefix_snapshot_gib,
    output_format: FormatOpt = OutputFormat.table,
    show_help: HelpOpt = False,
) -> None:
    """Parameters, weight, KV and GDN state bytes and the decode roofline, from the config alone.

    MODEL: a shipped config (tiny, qwen3.5-0.8b, ...), a YAML file,
    or a Hugging Face directory.
    """
    config = _model_config(model)
    if dtype not in _DTYPE_BYTES:
        raise typer.BadParameter(f"{dtype!r} is not one of {', '.join(_DTYPE_BYTES)}",
                                 param_hint="--dtype")
    if gdn_state_dtype not in _STATE_DTYPES:
        raise typer.BadParameter(f"{gdn_state_dtype!r} is not one of "
                                 f"{', '.join(_STATE_DTYPES)}", param_hint="--gdn-state-dtype")
    facts = model_facts(config, _DTYPE_BYTES[dtype], context, bandwidth,
                        state_bytes=_DTYPE_BYTES[gdn_state_dtype])
    try:
        num_snapshots = num_prefix_snapshots(EngineConfig(
            prefix_snapshots=prefix_snapshots, prefix_snapshot_gib=prefix_snapshot_gib,
            gdn_state_dtype=gdn_state_dtype), config, dtype)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--prefix-snapshot-gib") from None
    summary = {
        "model": facts.name,
        "num_layers": config.num_hidden_layers,
        "num_full_attention_layers": len(config.attention_layers),
        "num_gdn_layers": len(config.linear_layers),
        "num_parameters": facts.num_parameters,
        "dtype": dtype,
        "gdn_state_dtype": gdn_state_dtype,
        "weight_bytes": facts.weight_bytes,
        "kv_bytes_per_token": facts.kv_bytes_per_token,
        "gdn_recurrent_bytes_per_seq": facts.gdn_recurrent_bytes_per_seq,
        "gdn_conv_bytes_per_seq": facts.gdn_conv_bytes_per_seq,
        # the prefix cache's snapshot pool on the device (prefix_cache=on): one GDN state each
        "prefix_snapshots": num_snapshots,
        "prefix_snapshot_pool_bytes": num_snapshots * snapshot_bytes(config, dtype, 1,
                                                                     gdn_state_dtype),
        "context_tokens": context,
        "bandwidth_tb_s": bandwidth,
    }
    roofline = [
        {"batch": row.batch, "bytes_per_step": row.bytes_per_step,
         "ms_per_step": round(row.ms_per_step, 4), "tok_s_bound": round(row.tokens_per_s, 1)}
        for row in facts.roofline
    ]
    render({"model": summary, "decode_roofline": roofline}, output_format)


@app.command()
def serve(
    model: ModelArg,
    device: Annotated[Device, typer.Option(
        "--device", metavar=_choices(Device), help="auto: cuda when available, else cpu.")
    ] = Device.auto,
    host: Annotated[str, typer.Option(
        "--host", metavar="HOST", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(
        "--port", metavar="INT", **_ranged("Port to bind, {range}.", 1, 65535))] = 8000,
    knobs: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KNOB=VALUE", help="An engine knob, repeatable; beats RESIDENT_<KNOB> "
        "and the model YAML (`resident knobs` lists them).")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", metavar="KEY", envvar="RESIDENT_API_KEY",
        help="Require Authorization: Bearer <key>.")] = None,
    log_level: Annotated[str, typer.Option(
        "--log-level", metavar="LEVEL", help="DEBUG, INFO or WARNING.")] = "INFO",
    api_processes: Annotated[int, typer.Option(
        "--api-processes", metavar="INT", **_ranged(
            "API processes on the port, {range}; 0: one a 128 max_num_seqs, at most one a 4 "
            "CPUs (or an api_core CPU), at most 4.", 0, 64))] = 0,
    show_help: HelpOpt = False,
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (API processes and an engine core).

    MODEL: a shipped config (tiny, qwen3.5-0.8b, ...), a YAML file,
    or a Hugging Face directory.
    """
    from resident.server.api_processes import auto_api_processes, share_metrics

    config = _model_config(model)
    if api_key is not None and not api_key.strip():
        raise typer.BadParameter("an empty key would refuse every request; leave it out to "
                                 "serve without one", param_hint="--api-key")
    device_type = _device_type(device.value)
    try:
        # resolved once, here: a knob that cannot fit the model or the device fails before
        # anything starts, and the engine core builds from exactly this
        engine_config = build_engine_config(model_yaml_knobs(model), os.environ,
                                            parse_set_options(knobs or [])
                                            ).resolve(config, device_type)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--set") from None
    num_api = api_processes or auto_api_processes(
        len(os.sched_getaffinity(0)), engine_config.max_num_seqs,
        len(parse_cpu_list(engine_config.api_core, "api_core")))
    if num_api > 1:
        share_metrics()  # before anything imports prometheus_client
    from resident.server.serve import ServeOptions
    from resident.server.serve import serve as run_server

    options = ServeOptions(config, engine_config, device_type, host, port, api_key,
                           log_level.upper(), num_api)
    raise typer.Exit(run_server(options))


# one line a knob for `resident knobs`; tests/test_gate_cli.py checks every knob has one
KNOB_MEANINGS = {
    "dtype": "weights, KV cache and activations; auto: bfloat16 on CUDA, float32 on CPU",
    "gdn_state_dtype": "the GDN recurrent state's storage (float32 | bfloat16: half its bytes); "
                       "auto: float32, float64 in a float64 model",
    "page_size": "tokens a KV-cache page holds (a power of two)",
    "num_kv_pages": "KV-cache pages; 0: 4096 on CPU, as many as kv_cache_gib holds on CUDA",
    "kv_cache_gib": "GiB of KV cache on CUDA when num_kv_pages is 0",
    "max_model_len": "the longest sequence, prompt and output; 0: min(max positions, 32768)",
    "max_num_seqs": "the most sequences running at once",
    "num_state_slots": "GDN state slots; 0: max_num_seqs and the sink",
    "prefill_token_budget": "the most prompt tokens a step takes",
    "decode_buckets": "decode batch sizes; a decode step pads to the smallest that holds it",
    "decode_order": "the order of a step's decode rows",
    "resident_planning": "decode planning on the device (auto) or on the host (off)",
    "row_check": "debug: after each resident step, compare the device's rows with the streams",
    "phase_timing": "time each step's phases, read at GET /debug/phases",
    "plan_ahead": "stage step N+1 while N runs (on); also launch the next decode (launch)",
    "late_launch": "launch the step after a decode step late in its GPU time, taking the "
                   "requests that arrive until then into it (auto: on CUDA under launch)",
    "attention_backend": "the decode attention kernel; auto: triton on CUDA, torch on CPU",
    "cuda_graphs": "capture steps as CUDA graphs; auto: on for CUDA",
    "padded_prefill": "pad prefill and mixed steps to token buckets; auto: on for CUDA",
    "prefill_buckets": "padded steps' token sizes; empty: powers of two up to the largest step",
    "max_prefill_rows": "the most prefill chunks a step takes, besides its decode rows",
    "compile": "torch.compile of the dense parts; auto: on for CUDA",
    "decode_gemm": "projections of decode buckets of <= 16 rows: Triton GEMM (narrow: skinny, "
                   "all: wide) or cuBLAS",
    "gemv_table": "a bench_gemv --json file of this GPU: each decode projection of <= 64 "
                  "rows on what it timed fastest (Triton tile or cuBLAS); auto: "
                  "configs/gemv/<GPU name>.json "
                  "if committed; off",
    "fused_decode": "decode buckets: a GDN layer, an attention prologue, one kernel each, the "
                    "MLP's silu-mul in its gate_up (auto); "
                    "full: also the next add + norm and the attention output gate in the "
                    "kernels before them",
    "pdl": "programmatic dependent launch between decode kernels where the GPU has it (auto)",
    "prefix_cache": "start a request from its longest cached prompt prefix: KV pages shared, "
                    "GDN state restored from a snapshot",
    "prefix_snapshot_interval": "KV pages between the points where a prefill chunk that "
                                "ends there on its own snapshots the GDN state (prefix_cache)",
    "prefix_snapshot_tail": "cut every prompt at its last page boundary (prefix_cache): a "
                            "repeat restores there from its second request; a step a prompt",
    "prefix_snapshots": "GDN state snapshots the prefix cache keeps on the device (LRU); "
                        "0: what prefix_snapshot_gib holds, 64 at most",
    "prefix_snapshot_gib": "the snapshot pool's device budget in GiB when prefix_snapshots "
                           "is 0",
    "sampler": "the batched draw: torch (a sort), flashinfer or triton (a rejection race; "
               "both CUDA); auto: triton on CUDA, torch on CPU",
    "argmax": "each row's greedy token: torch's reduction, or triton (kernels/argmax.py: a row "
              "over many programs; CUDA); auto: triton on CUDA, torch on CPU",
    "token_ring": "a decode step's graph stores its tokens into pinned host memory, so their "
                  "read-back queues no copy (engine/token_ring.py); off: the copy",
    "varlen_splits": "the prefill and mixed steps' attention splits each query block's keys "
                     "over programs where its grid is short of the SMs (auto); off: one program "
                     "a block",
    "decode_splits": "the Triton decode attention splits each row's keys over programs until "
                     "a small bucket's grid has twice the SMs' count (auto, 8-64 splits); "
                     "off: 8",
    "tensor_parallel": "ranks the model is split over, an engine-core process and a GPU each "
                       "(gloo on CPU); kv_cache_gib is each rank's",
    "api_core": "CPU list for the API process; empty: not pinned",
    "step_thread_cores": "CPU list for the engine core's step thread; auto: two outside api_core",
    "core_idle_spin": "an engine core out of work polls for requests without waiting for 5 ms "
                      "before it sleeps (auto: on CUDA)",
    "gc_young_threshold": "the engine core's young-generation garbage collection threshold "
                          "(Python's: 700)",
    "seed": "the sampling seed of requests that bring none",
    "max_waiting": "requests in flight past max_num_seqs before new ones get a 429",
    "max_body_mib": "a request body's cap in MiB (413), checked before it is read",
    "request_timeout_s": "seconds a completion may run before it is aborted (504); 0: none",
    "read_timeout_s": "seconds a request's headers, then its body, may take to arrive",
    "shutdown_grace_s": "seconds in-flight requests get to finish after SIGTERM",
    "core_stall_s": "seconds the engine core may stay silent before the server fails and exits",
    "health_stall_s": "seconds the engine core may stay silent before /health says stalled",
    "max_connections": "connections open at once; 0: the descriptor limit less 64",
    "keepalive_timeout_s": "seconds a connection may idle after a response before it is closed",
    "send_stall_s": "seconds a client may leave its stream unread before it is dropped",
    "send_buffer_kib": "a connection's kernel send buffer and the API's buffer above it, KiB",
    "stream_interval": "a stream's tokens after its first leave the engine core this many at "
                       "a time (its last at once)",
    "event_loop": "the API processes' event loop: asyncio (the standard library's), uvloop, "
                  "or auto (uvloop where installed)",
    "profile_dir": "where POST /debug/profile writes traces; empty: <tmp>/resident-profiles",
}
_KNOB_TYPES = {"int": "integer", "float": "number", "str": "text",
               "tuple[int, ...]": "integers, comma-separated"}


def _knob_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "(empty)"
    return str(value) if value != "" else "(empty)"


def knob_rows() -> list[dict[str, str]]:
    """Every EngineConfig knob: its default, allowed values (or type), environment variable
    and meaning."""
    return [{"name": field.name, "default": _knob_text(field.default),
             "values": " | ".join(_CHOICES[field.name]) if field.name in _CHOICES
             else _KNOB_TYPES.get(str(field.type), str(field.type)),
             # "what": a column render() sets left, as text reads
             "env": env_name(field.name), "what": KNOB_MEANINGS.get(field.name, "")}
            for field in dataclasses.fields(EngineConfig)]


@app.command()
def knobs(output_format: FormatOpt = OutputFormat.table, show_help: HelpOpt = False) -> None:
    """Every engine knob: default, allowed values, environment variable and meaning.

    Set one with `--set KNOB=VALUE` (`resident serve`) or RESIDENT_<KNOB>;
    the model YAML's `engine:` mapping sits under both.
    """
    render({"knobs": knob_rows()}, output_format)


def _device_type(device: str) -> str:
    """cpu or cuda. `auto` asks torch; `cuda` is taken as given, so the API process (which
    serves HTTP and never needs torch) does not spend seconds importing it before it spawns
    the engine core: where torch sees no CUDA device, the core fails at the start of its build
    with that message and `serve` exits 1."""
    if device in ("cpu", "cuda"):
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main() -> None:
    app()
