"""`resident-gate run`."""

from __future__ import annotations

from rich.console import Console

from gate.commands import options as opt
from gate.commands.common import bad_parameter, exit_if_failed, open_session
from gate.config import option_fields
from gate.report.output import OutputFormat, print_summary
from gate.report.write import write_reports
from gate.run.session import Session
from resident.cli_flags import HelpOpt


def run(
    arm: opt.ArmOpt = None,
    knobs: opt.SetOpt = None,
    config: opt.ConfigOpt = None,
    aa: opt.AaOpt = None,
    model: opt.ModelOpt = None,
    device: opt.DeviceOpt = None,
    concurrency: opt.ConcurrencyOpt = None,
    prompt_len: opt.PromptLenOpt = None,
    shared_prefix_len: opt.SharedPrefixLenOpt = None,
    output_len: opt.OutputLenOpt = None,
    temperature: opt.TemperatureOpt = None,
    top_p: opt.TopPOpt = None,
    top_k: opt.TopKOpt = None,
    rounds: opt.RoundsOpt = None,
    until_verdict: opt.UntilVerdictOpt = None,
    max_rounds: opt.MaxRoundsOpt = None,
    min_effect: opt.MinEffectOpt = None,
    interleave: opt.InterleaveOpt = None,
    parallel_start: opt.ParallelStartOpt = None,
    runs: opt.RunsOpt = None,
    requests: opt.RequestsOpt = None,
    requests_per_slot: opt.RequestsPerSlotOpt = None,
    request_rate: opt.RequestRateOpt = None,
    clients: opt.ClientsOpt = None,
    seed: opt.SeedOpt = None,
    profile: opt.ProfileOpt = None,
    profile_steps: opt.ProfileStepsOpt = None,
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
    show_help: HelpOpt = False,
) -> None:
    """Gate arms against the baseline, round by round, and print the verdicts.

    Each round starts every arm's server once, in alternated order (ABBA), on the round's own
    Inductor cache and pinned cores (with --interleave all of them at once, their runs
    alternating); writes runs.jsonl, manifest.json, rounds.md, summary.md,
    summary.json, paired.md and the plots (with --profile, profile.md and the traces), and
    prints the summary.
    """
    given = option_fields(
        arm=arm, set=knobs, aa=aa, model=model, device=device, concurrency=concurrency,
        prompt_len=prompt_len, shared_prefix_len=shared_prefix_len, output_len=output_len,
        temperature=temperature, top_p=top_p, top_k=top_k, rounds=rounds,
        until_verdict=until_verdict, max_rounds=max_rounds, min_effect=min_effect,
        interleave=interleave, parallel_start=parallel_start, runs=runs, requests=requests,
        requests_per_slot=requests_per_slot, request_rate=request_rate, clients=clients,
        seed=seed, profile=profile,
        profile_steps=profile_steps, startup_timeout=startup_timeout, server_cpus=server_cpus,
        step_cores=step_cores, api_core=api_core, client_cpus=client_cpus, gpu=gpu, name=name,
        out=out)
    console = Console(stderr=True)
    session = open_session(Session, config, given, console, "session")
    with bad_parameter():
        failed = session.run(resume)
    rows = write_reports(session.out)
    print_summary(rows, session.manifest, output_format, session.out)
    console.log(f"wrote {session.out}")
    exit_if_failed(console, session, failed, "run")
