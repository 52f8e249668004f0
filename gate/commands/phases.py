"""`resident-gate phases`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from gate import options as opt
from gate.config import build_gate_config
from gate.output import OutputFormat, print_phases
from gate.phases import PHASES_MD, PhasesSession


def phases(
    arm: opt.ArmOpt = None,
    knobs: opt.SetOpt = None,
    config: opt.ConfigOpt = None,
    model: opt.ModelOpt = None,
    device: opt.DeviceOpt = None,
    concurrency: opt.ConcurrencyOpt = None,
    prompt_len: opt.PromptLenOpt = None,
    output_len: opt.OutputLenOpt = None,
    requests: opt.RequestsOpt = None,
    requests_per_slot: opt.RequestsPerSlotOpt = None,
    seed: opt.SeedOpt = None,
    startup_timeout: opt.StartupOpt = None,
    server_cpus: opt.ServerCpusOpt = None,
    step_cores: opt.StepCoresOpt = None,
    api_core: opt.ApiCoreOpt = None,
    client_cpus: opt.ClientCpusOpt = None,
    gpu: opt.GpuOpt = None,
    name: opt.NameOpt = None,
    out: opt.OutOpt = None,
    output_format: opt.FormatOpt = OutputFormat.table,
) -> None:
    """Where each arm's step time goes: one server per arm with phase timing on, a steady load
    per cell, the engine's phases read after a reset; writes phases.md (the plan thread's CPU
    by phase, and what each arm takes off the baseline's), phases.json and manifest.json."""
    given = dict(locals())
    console = Console(stderr=True)
    try:
        gate_config = build_gate_config(opt.gate_options(given), config)
        session = PhasesSession(gate_config, Path.cwd(), sys.argv)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if session.placement.client_cpus:
        os.sched_setaffinity(0, session.placement.client_cpus)
    console.log(f"phases {session.out}: arms {', '.join(a.name for a in session.arms)}, "
                f"placement {session.placement.to_dict()}")
    try:
        failed = session.run()
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    print_phases(session.results, session.manifest, output_format)
    console.log(f"wrote {session.out / PHASES_MD}")
    if failed:
        console.log(f"[red]{failed} cell(s) failed[/red]: " + "; ".join(session.failures[:5]))
        raise typer.Exit(1)
