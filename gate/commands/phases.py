"""`resident-gate phases`."""

from __future__ import annotations

from rich.console import Console

from gate.commands import options as opt
from gate.commands.common import bad_parameter, exit_if_failed, open_session
from gate.config import option_fields
from gate.report.output import OutputFormat, print_phases
from gate.report.phases import PHASES_MD, write_phases
from gate.run.phases import PhasesSession
from resident.cli_flags import HelpOpt


def phases(
    arm: opt.ArmOpt = None,
    knobs: opt.SetOpt = None,
    config: opt.ConfigOpt = None,
    model: opt.ModelOpt = None,
    device: opt.DeviceOpt = None,
    concurrency: opt.ConcurrencyOpt = None,
    prompt_len: opt.PromptLenOpt = None,
    output_len: opt.OutputLenOpt = None,
    temperature: opt.TemperatureOpt = None,
    top_p: opt.TopPOpt = None,
    top_k: opt.TopKOpt = None,
    requests: opt.RequestsOpt = None,
    requests_per_slot: opt.RequestsPerSlotOpt = None,
    clients: opt.ClientsOpt = None,
    seed: opt.SeedOpt = None,
    rounds: opt.RoundsOpt = None,
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
    """Where each arm's step time goes, by the engine's own phase timing.

    One server per arm with phase timing on, a steady load per cell, the engine's phases read
    after a reset; --rounds N starts each arm's server N times in alternated order and weighs
    the rounds by their steps. Writes phases.md (the plan thread's CPU by phase, and what each
    arm takes off the baseline's), phases.json (each round's too) and manifest.json.
    """
    given = option_fields(
        arm=arm, set=knobs, model=model, device=device, concurrency=concurrency,
        prompt_len=prompt_len, output_len=output_len,
        temperature=temperature, top_p=top_p, top_k=top_k, requests=requests,
        requests_per_slot=requests_per_slot, clients=clients, seed=seed, rounds=rounds,
        startup_timeout=startup_timeout, server_cpus=server_cpus, step_cores=step_cores,
        api_core=api_core, client_cpus=client_cpus, gpu=gpu, name=name, out=out)
    console = Console(stderr=True)
    session = open_session(PhasesSession, config, given, console, "phases")
    with bad_parameter():
        failed = session.run()
    write_phases(session.out, session.results, session.manifest)
    print_phases(session.results, session.manifest, output_format)
    console.log(f"wrote {session.out / PHASES_MD}")
    exit_if_failed(console, session, failed, "cell")
