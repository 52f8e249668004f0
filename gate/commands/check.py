"""`resident-gate check`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from gate.check.config import CHECK_KEYS, CHECK_PARAMS, GATE_KEYS, CheckConfig
from gate.check.report import CHECK_MD, print_check
from gate.check.session import CheckSession
from gate.commands import options as opt
from gate.commands.common import bad_parameter, start_session
from gate.config import GateConfig, build_gate_config, load_yaml
from gate.report.output import OutputFormat
from resident.cli_flags import HelpOpt


def check(
    arm: opt.ArmOpt = None,
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
    given = dict(locals())
    console = Console(stderr=True)
    with bad_parameter():
        gate_config, check_config = build_check_configs(given)
        session = CheckSession(gate_config, Path.cwd(), sys.argv, check=check_config)
    start_session(session, console, "check")
    with bad_parameter():
        code = session.run()
    print_check(session.report, session.manifest, output_format)
    console.log(f"wrote {session.out / CHECK_MD}: [bold]{session.report['verdict']}[/bold]")
    if code:
        raise typer.Exit(code)


def build_check_configs(given: dict[str, Any]) -> tuple[GateConfig, CheckConfig]:
    """The check command's parameters (its `locals()` on entry) and its --config file as the
    GateConfig its servers are launched from and its CheckConfig."""
    config_file: Path | None = given.get("config")
    gate_values: dict[str, Any] = {"name": "check"}
    check_values: dict[str, Any] = {}
    for key, value in (load_yaml(config_file) if config_file else {}).items():
        name = str(key).replace("-", "_")
        if name in CHECK_KEYS:
            check_values[CHECK_KEYS[name]] = value
        elif name in GATE_KEYS:
            gate_values[GATE_KEYS[name]] = value
        else:
            raise ValueError(f"--config {config_file}: unknown key {key!r} for a check; keys: "
                             f"{', '.join(sorted([*GATE_KEYS, *CHECK_KEYS]))}")
    check_values |= {CHECK_PARAMS[p]: given[p] for p in CHECK_PARAMS if given.get(p) is not None}
    options = opt.gate_options({k: v for k, v in given.items() if k not in CHECK_PARAMS})
    gate_values |= {k: v for k, v in options.items() if v is not None and v != []}
    return build_gate_config(gate_values, None), CheckConfig.from_values(check_values)
