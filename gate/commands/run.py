"""`resident-gate run`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from gate import options as opt
from gate.config import build_gate_config
from gate.output import OutputFormat, print_summary
from gate.records import read_manifest
from gate.session import Session
from gate.tables import write_reports


def run(
    arm: opt.ArmOpt = None,
    knobs: opt.SetOpt = None,
    config: opt.ConfigOpt = None,
    aa: opt.AaOpt = None,
    model: opt.ModelOpt = None,
    device: opt.DeviceOpt = None,
    concurrency: opt.ConcurrencyOpt = None,
    prompt_len: opt.PromptLenOpt = None,
    output_len: opt.OutputLenOpt = None,
    sessions: opt.SessionsOpt = None,
    runs: opt.RunsOpt = None,
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
    resume: opt.ResumeOpt = False,
    output_format: opt.FormatOpt = OutputFormat.table,
) -> None:
    """Gate arms against the baseline: alternated rounds, per-round Inductor caches, pinned
    cores; writes runs.jsonl, manifest.json, tables and plots, and prints the summary."""
    given = dict(locals())
    console = Console(stderr=True)
    try:
        gate_config = build_gate_config(opt.gate_options(given), config)
        session = Session(gate_config, Path.cwd(), sys.argv)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if session.placement.client_cpus:
        os.sched_setaffinity(0, session.placement.client_cpus)
    console.log(f"session {session.out}: arms {', '.join(a.name for a in session.arms)}, "
                f"placement {session.placement.to_dict()}")
    try:
        failed = session.run(resume)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    rows = write_reports(session.out)
    print_summary(rows, read_manifest(session.out), output_format)
    console.log(f"wrote {session.out}")
    if failed:
        console.log(f"[red]{failed} run(s) failed[/red]: " + "; ".join(session.failures[:5]))
        raise typer.Exit(1)
