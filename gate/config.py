"""GateConfig: everything a `resident-gate run` session needs, from options or a YAML file.

YAML keys are named like the options (`arm`, `set`, `concurrency`, `prompt_len`, ...); an option
given on the command line beats the file (GateConfig.from_options, option_fields).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gate.verdict.rule import MIN_EFFECT, Design

# One client process reads ~64 streams at a GPU's step rate for ~10 µs of CPU a token on a
# 2-core host (gate/run/sse_client.py); fewer processes read more events a wake-up, so each
# token costs less, until one nears a core (results/2026-12-04-h200-frontend)
SLOTS_PER_CLIENT = 128


def clients_for(concurrency: int, num_client_cpus: int, clients: int = 0) -> int:
    """Load client processes at `concurrency`: `clients` (--clients), or for 0 one per
    SLOTS_PER_CLIENT slots, at most one per client CPU; never more than the slots."""
    wanted = clients or min(num_client_cpus, concurrency // SLOTS_PER_CLIENT)
    return max(1, min(concurrency, wanted))


@dataclass(frozen=True)
class GateConfig:
    arms: tuple[str, ...] = ()  # NAME=SPEC, the first is the baseline
    knobs: tuple[str, ...] = ()  # --set knob=value | ARM.knob=value
    model: str = "tiny"
    device: str = "cpu"
    concurrency: tuple[int, ...] = (1, 16, 64)
    prompt_len: int = 512
    # tokens one shared prefix opens every prompt with, before its own prompt_len (0: none)
    shared_prefix_len: int = 0
    output_len: int = 256
    rounds: int = 2  # a fixed design's rounds
    until_verdict: bool = False  # add rounds until every cell has a verdict ...
    max_rounds: int | None = None  # ... or this many ran (only, and always, with until_verdict)
    min_effect: float = MIN_EFFECT  # the rule's floor (gate/verdict/rule.py)
    runs: int = 2
    # requests per run: one number for every cell or one per cell, in --concurrency's order;
    # none: max(8, requests_per_slot x concurrency)
    requests: tuple[int, ...] = ()
    requests_per_slot: int = 4
    # measured requests a second, open loop (load.py): one rate for every cell or one per cell,
    # each cell's concurrency the most in flight; none: a closed loop
    request_rate: tuple[float, ...] = ()
    clients: int = 0  # load client processes a run; 0: clients_for's rule
    aa: bool = False
    interleave: bool = False  # every arm's server up at once in a round, runs alternating
    parallel_start: bool = False  # with interleave: a round's servers launched together
    seed: int = 0
    name: str = "gate"
    out: str = ""  # default results/<name>-<timestamp>
    startup_timeout: float = 600.0
    server_cpus: str | None = None
    step_cores: str | None = None
    api_core: str | None = None
    client_cpus: str | None = None
    gpu: str | None = None
    profile: bool = False  # one profile window per arm and cell after round 1's timed runs
    profile_steps: int = 100
    # the workload's sampling, every request of every cell (0, 1, 0: greedy)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if len(self.arms) < 1:
            raise ValueError("--arm: give at least one arm (the first is the baseline)")
        for field in ("prompt_len", "output_len", "rounds", "runs"):
            if getattr(self, field) < 1:
                raise ValueError(f"--{field.replace('_', '-')} must be >= 1, "
                                 f"got {getattr(self, field)}")
        if self.shared_prefix_len < 0:
            raise ValueError(f"--shared-prefix-len must be >= 0, got {self.shared_prefix_len}")
        if self.profile_steps < 1:
            raise ValueError(f"--profile-steps must be >= 1, got {self.profile_steps}")
        if self.requests_per_slot < 1:
            raise ValueError(f"--requests-per-slot must be >= 1, got {self.requests_per_slot}")
        if any(n < 1 for n in self.requests):
            raise ValueError(f"--requests must be >= 1, got {_commas(self.requests)}")
        if len(self.requests) not in (0, 1, len(self.concurrency)):
            raise ValueError(f"--requests {_commas(self.requests)}: give one number, or one per "
                             f"cell of --concurrency {_commas(self.concurrency)}")
        if any(not 0 < rate < float("inf") for rate in self.request_rate):
            raise ValueError(f"--request-rate must be > 0 and finite, got "
                             f"{_commas(self.request_rate)}")
        if len(self.request_rate) not in (0, 1, len(self.concurrency)):
            raise ValueError(f"--request-rate {_commas(self.request_rate)}: give one rate, or one "
                             f"per cell of --concurrency {_commas(self.concurrency)}")
        if not 0 <= self.temperature < float("inf"):
            raise ValueError(f"--temperature must be >= 0 and finite, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"--top-k must be >= 0 (0: off), got {self.top_k}")
        if self.clients < 0:
            raise ValueError(f"--clients must be >= 0, got {self.clients}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"--concurrency must be positive ints, got {self.concurrency}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.until_verdict and self.max_rounds is None:
            raise ValueError("--until-verdict needs --max-rounds N: the most rounds to run")
        if not self.until_verdict and self.max_rounds is not None:
            raise ValueError(f"--max-rounds {self.max_rounds} goes with --until-verdict; for a "
                             "fixed number of rounds give --rounds")
        if self.parallel_start and not self.interleave:
            raise ValueError("--parallel-start goes with --interleave: one server at a time has "
                             "nothing to start alongside")
        Design(self.until_verdict, self.max_rounds or 0, self.min_effect)  # checks both

    @property
    def design(self) -> Design:
        """How the session's rounds are judged (gate/verdict/rule.py)."""
        return Design(self.until_verdict, self.max_rounds or 0, self.min_effect)

    @property
    def sampling(self) -> dict[str, float | int]:
        """The workload's sampling fields, as every request sends them and the manifest
        records them."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}

    @property
    def planned_rounds(self) -> int:
        """The most rounds the session runs: --rounds, or --max-rounds with --until-verdict."""
        return self.max_rounds if self.until_verdict else self.rounds

    def requests_for(self, concurrency: int) -> int:
        """The requests of a run at `concurrency` (a cell of the session)."""
        if len(self.requests) > 1:
            return self.requests[self.concurrency.index(concurrency)]
        if self.requests:
            return self.requests[0]
        return max(8, self.requests_per_slot * concurrency)

    def rate_for(self, concurrency: int) -> float:
        """The open loop's requests a second at `concurrency` (0.0: a closed loop)."""
        if len(self.request_rate) > 1:
            return self.request_rate[self.concurrency.index(concurrency)]
        return self.request_rate[0] if self.request_rate else 0.0

    @property
    def request_rates(self) -> dict[str, float] | None:
        """Each cell's open-loop rate, as the manifest records it; None for a closed loop."""
        return {f"c={c}": self.rate_for(c) for c in self.concurrency} if self.request_rate \
            else None

    def clients_for(self, concurrency: int, num_client_cpus: int) -> int:
        """Load client processes at `concurrency` (the module's clients_for)."""
        return clients_for(concurrency, num_client_cpus, self.clients)

    @classmethod
    def from_options(cls, config_file: Path | None, given: dict[str, Any]) -> GateConfig:
        """The session of a command line: `given`, the fields its options set
        (option_fields), over those of its --config file, over the defaults."""
        values = file_fields(config_file) if config_file is not None else {}
        if config_file is not None:
            _one_design(values, f"--config {config_file}")
        _one_design(given, "the command line")
        if given.get("until_verdict"):
            values.pop("rounds", None)
        return cls(**_typed(values | given))

    def out_dir(self) -> Path:
        return Path(self.out or f"results/{self.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def _commas(values: tuple[float, ...]) -> str:
    return ",".join(map(str, values))


def parse_ints(text: str | int | list | tuple, option: str) -> tuple[int, ...]:
    return _parse_list(text, option, int, "integers like 1,16,64")


def parse_floats(text: str | float | list | tuple, option: str) -> tuple[float, ...]:
    return _parse_list(text, option, float, "numbers like 4,12.5")


def _parse_list(text, option: str, kind: type, expected: str) -> tuple:
    """`1,16,64`, one number, or a YAML list, as a tuple of `kind`."""
    items = text.split(",") if isinstance(text, str) else (
        list(text) if isinstance(text, list | tuple) else [text])
    try:
        return tuple(kind(str(item).strip()) for item in items if str(item).strip())
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected {expected}") from None


def load_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"--config {path}: no such file")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping of options")
    return data


def _one_design(values: dict[str, Any], where: str) -> None:
    """A fixed number of rounds or --until-verdict, not both from one source (the command line
    may still turn a file's fixed design into --until-verdict)."""
    if values.get("until_verdict") and "rounds" in values:
        raise ValueError(f"{where}: --rounds {values['rounds']} and --until-verdict: give "
                         "--rounds for a fixed number, or --until-verdict with --max-rounds")


def option_fields(  # noqa: PLR0913 - one keyword an option
        *, arm: list[str] | None = None, set: list[str] | None = None,  # noqa: A002
        model: str | None = None, device: str | None = None,
        concurrency: str | list[int] | None = None, prompt_len: int | None = None,
        shared_prefix_len: int | None = None, output_len: int | None = None,
        rounds: int | None = None,
        until_verdict: bool | None = None, max_rounds: int | None = None,
        min_effect: float | None = None, runs: int | None = None,
        requests: str | list[int] | None = None, requests_per_slot: int | None = None,
        request_rate: str | list[float] | None = None, clients: int | None = None,
        aa: bool | None = None, interleave: bool | None = None,
        parallel_start: bool | None = None, seed: int | None = None, name: str | None = None,
        out: str | None = None, startup_timeout: float | None = None,
        server_cpus: str | None = None, step_cores: str | None = None,
        api_core: str | None = None, client_cpus: str | None = None, gpu: str | None = None,
        profile: bool | None = None, profile_steps: int | None = None,
        temperature: float | None = None, top_p: float | None = None,
        top_k: int | None = None) -> dict[str, Any]:
    """Gate options, named as on the command line and as the keys of a --config file, as the
    GateConfig fields they set; an option not given (None, or an empty list) sets none."""
    fields = {
        "arms": arm, "knobs": set, "model": model, "device": device,
        "concurrency": concurrency, "prompt_len": prompt_len,
        "shared_prefix_len": shared_prefix_len, "output_len": output_len,
        "rounds": rounds, "until_verdict": until_verdict, "max_rounds": max_rounds,
        "min_effect": min_effect, "runs": runs, "requests": requests,
        "requests_per_slot": requests_per_slot, "request_rate": request_rate,
        "clients": clients, "aa": aa,
        "interleave": interleave, "parallel_start": parallel_start, "seed": seed, "name": name,
        "out": out, "startup_timeout": startup_timeout, "server_cpus": server_cpus,
        "step_cores": step_cores, "api_core": api_core, "client_cpus": client_cpus, "gpu": gpu,
        "profile": profile, "profile_steps": profile_steps, "temperature": temperature,
        "top_p": top_p, "top_k": top_k,
    }
    return {field: value for field, value in fields.items() if value is not None and value != []}


def file_fields(config_file: Path) -> dict[str, Any]:
    """The GateConfig fields a --config file sets; its keys are option names (`arm`, `set`,
    `prompt_len` or `prompt-len`, ...)."""
    options: dict[str, Any] = {}
    for key, value in load_yaml(config_file).items():
        option = str(key).replace("-", "_")
        if option in options:
            raise ValueError(f"--config {config_file}: {key!r} gives {option} a second time")
        options[option] = value
    try:
        return option_fields(**options)
    except TypeError as err:  # an unknown keyword: name the key
        key = str(err).rpartition(" ")[2]
        raise ValueError(f"--config {config_file}: unknown key {key}") from None


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    """Lists of arms and knobs as tuples of strings, and `1,16,64` as ints."""
    for key in ("arms", "knobs"):
        if key in values:
            values[key] = tuple(str(v) for v in values[key])
    for key in ("concurrency", "requests"):
        if key in values:
            values[key] = parse_ints(values[key], f"--{key}")
    if "request_rate" in values:
        values["request_rate"] = parse_floats(values["request_rate"], "--request-rate")
    return values
