"""`resident-gate check`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from gate.check.config import CHECK_OPTIONS, GATE_OPTIONS, CheckConfig
from gate.check.report import CHECK_MD, print_check
from gate.check.session import CheckSession
from gate.commands import options as opt
from gate.commands.common import bad_parameter, start_session
from gate.config import GateConfig, load_yaml, option_fields
from gate.report.output import OutputFormat
from resident.cli_flags import HelpOpt


def check(
    arm: opt.CheckArmOpt = None,
    knobs: opt.SetOpt = None,
    config: opt.ConfigOpt = None,
    sweep: opt.SweepOpt = None,
    prompts: opt.PromptsOpt = None,
    max_tokens: opt.MaxTokensOpt = None,
    near_tie: opt.NearTieOpt = None,
    model: opt.ModelOpt = None,
    device: opt.DeviceOpt = None,
    startup_timeout: opt.StartupOpt = None,
    server_cpus: opt.ServerCpusOpt = None,
    step_cores: opt.StepCoresOpt = None,
    api_core: opt.ApiCoreOpt = None,
    client_cpus: opt.ClientCpusOpt = None,
    gpu: opt.GpuOpt = None,
    name: opt.NameOpt = None,
    out: opt.OutOpt = None,
    output_format: opt.FormatOpt = OutputFormat.table,
    show_help: HelpOpt = False,
) -> None:
    """Correctness before throughput: greedy tokens of each arm against the baseline's beside
    the baseline against a second server of itself (the yardstick), at c=1, at c=8 and under KV
    pressure, and the row check under slot and KV pressure. Writes check.md, check.json,
    manifest.json and the servers' logs; exits 0 on pass, 1 on fail."""
    console = Console(stderr=True)
    with bad_parameter():
        gate_config, check_config = build_check_configs(
            config,
            option_fields(arm=arm, set=knobs, model=model, device=device,
                          startup_timeout=startup_timeout, server_cpus=server_cpus,
                          step_cores=step_cores, api_core=api_core, client_cpus=client_cpus,
                          gpu=gpu, name=name, out=out),
            {"sweep": sweep, "prompts": prompts, "max_tokens": max_tokens, "near_tie": near_tie})
        session = CheckSession(gate_config, Path.cwd(), sys.argv, check=check_config)
    start_session(session, console, "check")
    with bad_parameter():
        code = session.run()
    print_check(session.report, session.manifest, output_format)
    console.log(f"wrote {session.out / CHECK_MD}: [bold]{session.report['verdict']}[/bold]")
    if code:
        raise typer.Exit(code)


def build_check_configs(config_file: Path | None, gate_given: dict[str, Any],
                        check_given: dict[str, Any]) -> tuple[GateConfig, CheckConfig]:
    """The GateConfig a check's servers are launched from and its CheckConfig: the command
    line's options (`gate_given`: option_fields of its `run` options; `check_given`: its own,
    None where not given) over its --config file's."""
    gate_values: dict[str, Any] = {"name": "check"}
    check_values: dict[str, Any] = {}
    if config_file is not None:
        gate_file: dict[str, Any] = {}
        for key, value in load_yaml(config_file).items():
            option = str(key).replace("-", "_")
            if option in CHECK_OPTIONS:
                check_values[option] = value
            elif option in GATE_OPTIONS:
                gate_file[option] = value
            else:
                raise ValueError(f"--config {config_file}: unknown key {key!r} for a check; "
                                 f"keys: {', '.join(sorted([*GATE_OPTIONS, *CHECK_OPTIONS]))}")
        gate_values |= option_fields(**gate_file)
    check_values |= {key: value for key, value in check_given.items() if value is not None}
    return (GateConfig.from_options(None, gate_values | gate_given),
            CheckConfig.from_values(check_values))
