"""Options shared by the gate's commands, defined once.

Options that a --config file may also set default to None here, so that the file's value shows
through; their help states the real default, taken from GateConfig, as `[default: X]`, the style
typer gives options whose default it knows. Metavars name what a value is (INT, NAME=SPEC);
flags have none.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from gate.check.config import CheckConfig
from gate.config import GateConfig
from gate.report.output import OutputFormat

ARMS = "Arms"
CELLS = "Cells"
ROUNDS = "Rounds and verdicts"
PLACEMENT = "Placement"
PROFILE = "Profile"

_DEFAULTS = {field.name: field.default for field in dataclasses.fields(GateConfig)}


def default(text: str) -> str:
    """` [default: text]`, its bracket escaped from rich markup."""
    return f" \\[default: {text}]"


def config_default(field: str) -> str:
    """` [default: X]` for a GateConfig field; lists print with commas."""
    value = _DEFAULTS[field]
    return default(",".join(map(str, value)) if isinstance(value, tuple) else str(value))


ARM_HELP = "An arm, repeatable; the first is the baseline. SPEC: git:<ref>, path:<dir>, ."
ArmOpt = Annotated[list[str] | None, typer.Option(
    "--arm", metavar="NAME=SPEC", help=ARM_HELP + " or cmd:<server command with {host} {port}>.",
    rich_help_panel=ARMS)]
# the check sets knobs and reads /debug/rowcheck: resident arms only
CheckArmOpt = Annotated[list[str] | None, typer.Option(
    "--arm", metavar="NAME=SPEC", help=ARM_HELP + " (resident trees only: no cmd:).",
    rich_help_panel=ARMS)]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", metavar="[ARM.]KNOB=VALUE", help="An engine knob for every arm, or with ARM. for "
    "one; repeatable (`resident knobs` lists them).", rich_help_panel=ARMS)]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", metavar="FILE", help="A YAML file of these options (configs/gate/*.yaml); "
    "options given here win.", rich_help_panel=ARMS)]
AaOpt = Annotated[bool | None, typer.Option(
    "--aa/--no-aa", metavar="", help="Add a second copy of the baseline: the noise model of "
    "the verdicts." + default("--no-aa"), rich_help_panel=ARMS)]
StartupOpt = Annotated[float | None, typer.Option(
    "--startup-timeout", metavar="SECONDS", help="How long a server may take to answer "
    "/health." + config_default("startup_timeout"), rich_help_panel=ARMS)]

# named explicitly: typer 0.27 derives this one's name from its metavar ("--MODEL")
ModelOpt = Annotated[str | None, typer.Option(
    "--model", metavar="MODEL", help="A model config or directory." + config_default("model"),
    rich_help_panel=CELLS)]
DeviceOpt = Annotated[str | None, typer.Option(
    metavar="[cpu|cuda]", help="Where the servers run." + config_default("device"),
    rich_help_panel=CELLS)]
ConcurrencyOpt = Annotated[str | None, typer.Option(
    metavar="INT,...", help="Concurrencies, one cell each." + config_default("concurrency"),
    rich_help_panel=CELLS)]
PromptLenOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Prompt tokens." + config_default("prompt_len"), rich_help_panel=CELLS)]
SharedPrefixLenOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Tokens of one shared prefix every prompt opens with, before its own "
    "--prompt-len (what a prefix cache buys)." + config_default("shared_prefix_len"),
    rich_help_panel=CELLS)]
OutputLenOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Output tokens, ignore_eos." + config_default("output_len"),
    rich_help_panel=CELLS)]
RunsOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Runs per cell per round." + config_default("runs"),
    rich_help_panel=CELLS)]
RequestsOpt = Annotated[str | None, typer.Option(
    metavar="INT,...", help="Requests per run: one number for every cell, or one per cell in "
    "--concurrency's order." + default("max(8, requests-per-slot x concurrency)"),
    rich_help_panel=CELLS)]
RequestsPerSlotOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Requests per run per unit of concurrency, when --requests is not "
    "given." + config_default("requests_per_slot"), rich_help_panel=CELLS)]
RequestRateOpt = Annotated[str | None, typer.Option(
    metavar="FLOAT,...", help="Open loop: measured requests a second, Poisson arrivals, at most "
    "the cell's concurrency in flight (a request finding every slot busy waits, and is "
    "counted); one rate for every cell, or one per cell in --concurrency's order."
    + default("none: a closed loop, each slot sending its next request as its last ends"),
    rich_help_panel=CELLS)]
ClientsOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Load client processes a run, each driving its share of the slots; 0: "
    "one per 128 slots, at most one per client CPU." + config_default("clients"),
    rich_help_panel=CELLS)]
TemperatureOpt = Annotated[float | None, typer.Option(
    metavar="FLOAT", help="Every request's temperature (0: greedy)."
    + config_default("temperature"), rich_help_panel=CELLS)]
TopPOpt = Annotated[float | None, typer.Option(
    metavar="FLOAT", help="Every request's top_p (1: off)." + config_default("top_p"),
    rich_help_panel=CELLS)]
TopKOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Every request's top_k (0: off)." + config_default("top_k"),
    rich_help_panel=CELLS)]
SeedOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Prompt seed base." + config_default("seed"), rich_help_panel=CELLS)]

RoundsOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Rounds, judged once at the end: each starts every arm's server once, "
    "in alternated order." + config_default("rounds"), rich_help_panel=ROUNDS)]
UntilVerdictOpt = Annotated[bool | None, typer.Option(
    "--until-verdict", metavar="", help="Instead of --rounds: add rounds until every arm has a "
    "verdict in every cell, at most --max-rounds; the rule is applied after each round.",
    rich_help_panel=ROUNDS)]
MaxRoundsOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="With --until-verdict: the most rounds to run.", rich_help_panel=ROUNDS)]
MinEffectOpt = Annotated[float | None, typer.Option(
    metavar="FRACTION", help="The smallest difference that counts: faster and slower need the "
    "estimate beyond it, within noise the interval inside it." + config_default("min_effect"),
    rich_help_panel=ROUNDS)]
InterleaveOpt = Annotated[bool | None, typer.Option(
    "--interleave", metavar="", help="Start every arm's server of a round before any run, and "
    "alternate the arms run by run within each cell, each round then judged slot by slot: a "
    "host whose speed drifts over seconds (a shared VM) then slows every arm alike. The "
    "servers must fit side by side (GPU memory).", rich_help_panel=ROUNDS)]
ParallelStartOpt = Annotated[bool | None, typer.Option(
    "--parallel-start", metavar="", help="With --interleave: launch a round's servers together "
    "rather than one after another. Quicker where a start is mostly imports (the tiny model on "
    "a CPU); with torch.compile each server then compiles for itself, so a round's arms no "
    "longer replay one set of kernel choices from its Inductor cache.", rich_help_panel=ROUNDS)]

ProfileOpt = Annotated[bool | None, typer.Option(
    "--profile", metavar="", help="After the timed runs of round 1, one profile window per arm "
    "and cell in a steady load (POST /debug/profile): profile.md, profiles/*.json.gz. The "
    "timed runs are never profiled.", rich_help_panel=PROFILE)]
ProfileStepsOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Steps in each profile window." + config_default("profile_steps"),
    rich_help_panel=PROFILE)]

ServerCpusOpt = Annotated[str | None, typer.Option(
    metavar="CPUS", help="CPU list for the servers, e.g. 0-3,8.", rich_help_panel=PLACEMENT)]
StepCoresOpt = Annotated[str | None, typer.Option(
    metavar="CPUS", help="CPUs for the engine's step threads.", rich_help_panel=PLACEMENT)]
ApiCoreOpt = Annotated[str | None, typer.Option(
    metavar="CPUS", help="CPU for the API process.", rich_help_panel=PLACEMENT)]
ClientCpusOpt = Annotated[str | None, typer.Option(
    metavar="CPUS", help="CPU list for the load client.", rich_help_panel=PLACEMENT)]
GpuOpt = Annotated[str | None, typer.Option(
    metavar="INT", help="GPU index." + default("0 with --device cuda"),
    rich_help_panel=PLACEMENT)]

NameOpt = Annotated[str | None, typer.Option(
    metavar="TEXT", help="Session name." + config_default("name"))]
OutOpt = Annotated[str | None, typer.Option(
    metavar="DIR", help="Output directory." + default("results/<name>-<time>"))]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume", metavar="", help="Continue the session in --out: keep its whole rounds, run "
    "the rest up to --rounds or --max-rounds (raise it to add rounds); its arms, cells, load "
    "and design must match.")]
FormatOpt = Annotated[OutputFormat, typer.Option(
    "--format", metavar="[table|json|md]", help="How the summary prints on stdout.")]


# resident-gate check (defaults: gate/check/config.py CheckConfig)
CHECK = "Check"
_CHECK_DEFAULTS = {field.name: field.default for field in dataclasses.fields(CheckConfig)}
SweepOpt = Annotated[str | None, typer.Option(
    metavar="SWEEP,...", help="Sweeps: greedy, concurrency, seeded, kv-pressure, rows."
    + default(",".join(_CHECK_DEFAULTS["sweeps"])), rich_help_panel=CHECK)]
PromptsOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Prompts from the prompt file, the same for every arm."
    + default(str(_CHECK_DEFAULTS["prompts"])), rich_help_panel=CHECK)]
MaxTokensOpt = Annotated[int | None, typer.Option(
    metavar="INT", help="Token cap a request; EOS may stop it first."
    + default(str(_CHECK_DEFAULTS["max_tokens"])), rich_help_panel=CHECK)]
NearTieOpt = Annotated[float | None, typer.Option(
    metavar="NATS", help="A divergence whose two tokens' logprobs are closer is a near-tie."
    + default(str(_CHECK_DEFAULTS["near_tie"])), rich_help_panel=CHECK)]
