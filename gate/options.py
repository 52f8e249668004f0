"""Options shared by the gate's commands, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gate.output import OutputFormat

ARMS = "Arms"
CELLS = "Cells"
PLACEMENT = "Placement"

ArmOpt = Annotated[list[str] | None, typer.Option(
    "--arm", help="NAME=SPEC, repeatable; the first is the baseline. SPEC: git:<ref>, "
    "path:<dir>, . or cmd:<server command with {host} {port}>.", rich_help_panel=ARMS)]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="knob=value for every arm, ARM.knob=value for one; repeatable.",
    rich_help_panel=ARMS)]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="A YAML file of these options (configs/gate/*.yaml); options given here "
    "win.", rich_help_panel=ARMS)]
AaOpt = Annotated[bool | None, typer.Option(
    "--aa/--no-aa", help="Add a second copy of the baseline to measure the noise floor.",
    rich_help_panel=ARMS)]
ModelOpt = Annotated[str | None, typer.Option(help="Model config or directory \\[tiny].",
                                              rich_help_panel=CELLS)]
DeviceOpt = Annotated[str | None, typer.Option(help="cpu or cuda \\[cpu].", rich_help_panel=CELLS)]
ConcurrencyOpt = Annotated[str | None, typer.Option(
    help="Concurrencies, one cell each \\[1,16,64].", rich_help_panel=CELLS)]
PromptLenOpt = Annotated[int | None, typer.Option(help="Prompt tokens \\[512].",
                                                  rich_help_panel=CELLS)]
OutputLenOpt = Annotated[int | None, typer.Option(help="Output tokens, ignore_eos \\[256].",
                                                  rich_help_panel=CELLS)]
RoundsOpt = Annotated[int | None, typer.Option(
    help="Rounds: each starts every arm's server once, in alternated order \\[2].",
    rich_help_panel=CELLS)]
UntilVerdictOpt = Annotated[bool | None, typer.Option(
    "--until-verdict", metavar="", help="Add rounds until every cell has a verdict, at most "
    "--max-rounds; the rule is applied after each round (paired.md says how).",
    rich_help_panel=CELLS)]
MaxRoundsOpt = Annotated[int | None, typer.Option(
    help="With --until-verdict: the most rounds to run.", rich_help_panel=CELLS)]
MinEffectOpt = Annotated[float | None, typer.Option(
    help="The smallest difference that counts, a fraction: faster/slower need the estimate "
    "beyond it, within noise the interval inside it \\[0.01].", rich_help_panel=CELLS)]
# the option's old name, still accepted
SessionsOpt = Annotated[int | None, typer.Option("--sessions", hidden=True)]
RunsOpt = Annotated[int | None, typer.Option(help="Runs per cell per round \\[2].",
                                             rich_help_panel=CELLS)]
RequestsOpt = Annotated[int | None, typer.Option(
    help="Requests per run \\[max(8, requests-per-slot x concurrency)].", rich_help_panel=CELLS)]
RequestsPerSlotOpt = Annotated[int | None, typer.Option(
    help="Requests per run per unit of concurrency, when --requests is not given \\[4].",
    rich_help_panel=CELLS)]
SeedOpt = Annotated[int | None, typer.Option(help="Prompt seed base \\[0].", rich_help_panel=CELLS)]
StartupOpt = Annotated[float | None, typer.Option(
    "--startup-timeout", help="Seconds a server may take to answer /health \\[600].",
    rich_help_panel=ARMS)]
ServerCpusOpt = Annotated[str | None, typer.Option(help="CPU list for the servers.",
                                                   rich_help_panel=PLACEMENT)]
StepCoresOpt = Annotated[str | None, typer.Option(help="CPUs for the engine's step threads.",
                                                  rich_help_panel=PLACEMENT)]
ApiCoreOpt = Annotated[str | None, typer.Option(help="CPU for the API process.",
                                                rich_help_panel=PLACEMENT)]
ClientCpusOpt = Annotated[str | None, typer.Option(help="CPU list for the load client.",
                                                   rich_help_panel=PLACEMENT)]
GpuOpt = Annotated[str | None, typer.Option(help="GPU index \\[0 with --device cuda].",
                                            rich_help_panel=PLACEMENT)]
NameOpt = Annotated[str | None, typer.Option(help="Session name \\[gate].")]
OutOpt = Annotated[str | None, typer.Option(help="Output directory \\[results/<name>-<time>].")]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume", help="Continue the session in --out: keep its whole rounds, run the rest up "
    "to --rounds (raise it to add rounds); its arms, cells and load must match.")]
FormatOpt = Annotated[OutputFormat, typer.Option(
    "--format", help="How the summary prints on stdout: table, json or md.")]


# command parameters that are not GateConfig fields, and those named differently
_NOT_CONFIG = ("config", "resume", "output_format", "sessions")
_FIELD_OF = {"arm": "arms"}


def gate_options(params: dict[str, Any]) -> dict[str, Any]:
    """A command's parameters (its `locals()` on entry) as GateConfig fields; `--sessions`, the
    old name of `--rounds`, counts as `--rounds`."""
    options = {_FIELD_OF.get(name, name): value for name, value in params.items()
               if name not in _NOT_CONFIG}
    sessions = params.get("sessions")
    if sessions is not None:
        if options.get("rounds") not in (None, sessions):
            raise ValueError(f"--sessions {sessions} and --rounds {options['rounds']}: "
                             "--sessions is the old name of --rounds; give one")
        options["rounds"] = sessions
    return options
