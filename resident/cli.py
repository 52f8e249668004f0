"""The `resident` command line: one function per command, options defined once."""

from __future__ import annotations

import enum
import os
from typing import Annotated

import typer

from resident.config import build_engine_config, model_yaml_knobs, parse_set_options
from resident.info import model_facts
from resident.model.config import load_model_config
from resident.render import OutputFormat, render

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="resident: a Qwen3.5 serving engine with decode planning on the GPU.")

ModelArg = Annotated[str, typer.Argument(
    metavar="MODEL",
    help="A shipped config (tiny, qwen3.5-0.8b, ...), a YAML file, or a Hugging Face directory.",
)]
FormatOpt = Annotated[OutputFormat, typer.Option("--format", help="table or json.")]



@app.callback()
def _root() -> None:
    """resident: a Qwen3.5 serving engine with decode planning on the GPU."""


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _model_config(model: str):
    try:
        return load_model_config(model)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="MODEL") from None


@app.command()
def info(
    model: ModelArg,
    context: Annotated[int, typer.Option(min=0, help="Tokens of KV each sequence reads.")] = 640,
    bandwidth: Annotated[float, typer.Option(
        min=0.001, help="Memory bandwidth in TB/s (4.28: the H200's measured copy bandwidth).")
    ] = 4.28,
    dtype: Annotated[str, typer.Option(help="Weight and KV dtype: bfloat16, float16, float32.")
                     ] = "bfloat16",
    output_format: FormatOpt = OutputFormat.table,
) -> None:
    """Parameters, weight, KV and GDN state bytes and the decode roofline, from the config alone."""
    config = _model_config(model)
    if dtype not in _DTYPE_BYTES:
        raise typer.BadParameter(f"{dtype!r} is not one of {', '.join(_DTYPE_BYTES)}",
                                 param_hint="--dtype")
    facts = model_facts(config, _DTYPE_BYTES[dtype], context, bandwidth)
    summary = {
        "model": facts.name,
        "num_layers": config.num_hidden_layers,
        "num_full_attention_layers": len(config.attention_layers),
        "num_gdn_layers": len(config.linear_layers),
        "num_parameters": facts.num_parameters,
        "dtype": dtype,
        "weight_bytes": facts.weight_bytes,
        "kv_bytes_per_token": facts.kv_bytes_per_token,
        "gdn_recurrent_bytes_per_seq": facts.gdn_recurrent_bytes_per_seq,
        "gdn_conv_bytes_per_seq": facts.gdn_conv_bytes_per_seq,
        "context_tokens": context,
        "bandwidth_tb_s": bandwidth,
    }
    roofline = [
        {"batch": row.batch, "bytes_per_step": row.bytes_per_step,
         "ms_per_step": round(row.ms_per_step, 4), "tok_s_bound": round(row.tokens_per_s, 1)}
        for row in facts.roofline
    ]
    render({"model": summary, "decode_roofline": roofline}, output_format)


class Device(enum.StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


@app.command()
def serve(
    model: ModelArg,
    device: Annotated[Device, typer.Option(help="auto: cuda when available, else cpu.")] =
    Device.auto,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    knobs: Annotated[list[str] | None, typer.Option(
        "--set", help="knob=value, repeatable; beats RESIDENT_<KNOB> and the model YAML.")
    ] = None,
    api_key: Annotated[str | None, typer.Option(
        envvar="RESIDENT_API_KEY", help="Require Authorization: Bearer <key>.")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING.")] = "INFO",
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (an API process and an engine core)."""
    from resident.server.serve import ServeOptions
    from resident.server.serve import serve as run_server

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
    options = ServeOptions(config, engine_config, device_type, host, port, api_key,
                           log_level.upper())
    raise typer.Exit(run_server(options))


def _device_type(device: str) -> str:
    """cpu or cuda; `cuda` where torch sees no CUDA device fails here, before anything
    starts."""
    if device == "cpu":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise typer.BadParameter(f"cuda: torch {torch.__version__} sees no CUDA device",
                                 param_hint="--device")
    return "cpu"


def main() -> None:
    app()
