"""What `resident-gate check` runs: its sweeps and their settings (CheckConfig), the prompts, and
the server launches the sweeps need.

A check YAML (configs/gate/check-*.yaml) holds the arm and placement keys `run` takes (`arm`,
`set`, `model`, `device`, `name`, `out`, `startup_timeout`, `server_cpus`, `step_cores`,
`api_core`, `client_cpus`, `gpu`) beside the check's own: `sweep`, `prompts`, `max_tokens`,
`concurrency`, `slot_concurrency`, `seeded_concurrency`, `logprobs`, `near_tie`, `kv_pressure`,
`slot_pressure` and `prompt_file`. Options given on the command line win over the file.

Each sweep's knobs are its own and go to every arm alike (after the arm's own `--set` knobs), so
the sweeps group into launches, one server per arm and knob set, in this order:

- `plain` (no knobs): greedy at c=1, then concurrency at c=`concurrency`, then seeded at
  c=`seeded_concurrency` (`concurrency` unless set; each prompt sampled, SEEDED_SAMPLING, with
  its index as its seed: the same seed must give the same bytes whatever else the server
  batches with it, which holds where logits do not move with the batch: on CPU in float64,
  not on a GPU in bf16, where the H200 configs run it at c=1);
- `kv-pressure` (`kv_pressure` knobs, row_check=on): the prompts at c=`concurrency`; it serves
  the kv-pressure sweep and the rows sweep's KV-pressure reading;
- `slot-pressure` (`slot_pressure` knobs, row_check=on): the prompts at c=`slot_concurrency`,
  for the rows sweep, whose tokens it also judges;
- `prefix-off` and `prefix-on` (the prefix sweep, asked by name: not among the defaults): the
  prompts, each opened by one shared preamble (the first prompt), at c=`concurrency`; under
  prefix-off the heads run prefix_cache=off by name (whatever their default); under
  prefix-on the heads (not the baseline or its yardstick, which keep the cache off: main may
  not know the knob) run prefix_cache=on and prefix_snapshot_tail=on with the row check, and
  take the prompts twice, a first pass (`prefix-first`) and then the same prompts again
  (`prefix-again`, now hits).

The yardstick (a second server of the baseline) runs every launch: every load's tokens are
judged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gate.run.arms import split_knobs

SWEEPS = ("greedy", "concurrency", "seeded", "kv-pressure", "rows", "prefix")
DEFAULT_SWEEPS = ("greedy", "concurrency", "seeded", "kv-pressure", "rows")  # prefix: by name
PREFIX_LOADS = ("prefix-off", "prefix-first", "prefix-again")  # the prefix sweep's loads
# the heads' under prefix-on: the tail snapshot too, so a prompt's repeat restores at its last
# page boundary (the deepest restore; without it prompts shorter than the snapshot interval
# could not hit at all)
PREFIX_KNOBS = {"prefix_cache": "on", "prefix_snapshot_tail": "on", "row_check": "on"}
# the seeded sweep's sampling; each prompt's seed is its index
SEEDED_SAMPLING = {"temperature": 0.7, "top_p": 0.9}
PROMPT_FILE = "configs/prompts/public-domain.yaml"
MAX_LOGPROBS = 20  # the most resident's API gives (vLLM's default limit)

# a check's --config keys (dashes or underscores): its own options, named as its fields (but
# `sweep`, the option, for `sweeps`), and the `run` options a check takes (config.option_fields)
CHECK_OPTIONS = ("sweep", "prompts", "max_tokens", "concurrency", "slot_concurrency",
                 "seeded_concurrency", "logprobs", "near_tie", "kv_pressure", "slot_pressure",
                 "prompt_file")
GATE_OPTIONS = ("arm", "set", "model", "device", "name", "out", "startup_timeout", "server_cpus",
                "step_cores", "api_core", "client_cpus", "gpu")


def _listed(name: str, value: Any, split: bool) -> tuple[str, ...]:
    """A list option from YAML or the command line: a list, or one text (comma-separated when
    `split`: knob values such as decode_buckets=1,2,4,8 hold commas themselves)."""
    if isinstance(value, str):
        items = value.split(",") if split else [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ValueError(f"{name.replace('_', '-')} must be a list, got {value!r}")
    return tuple(str(item).strip() for item in items if str(item).strip())


@dataclass(frozen=True)
class CheckConfig:
    """The check's sweeps and settings; every field is validated here (ValueError naming it)."""

    sweeps: tuple[str, ...] = DEFAULT_SWEEPS
    prompts: int = 32
    max_tokens: int = 128  # the token cap; EOS stops a request before it
    concurrency: int = 8  # the concurrency and kv-pressure sweeps
    slot_concurrency: int = 32  # the rows sweep under slot pressure: more rows than slots
    seeded_concurrency: int | None = None  # the seeded sweep; None: concurrency
    logprobs: int | None = 5  # top logprobs asked of servers that give them
    near_tie: float = 0.1  # nats: a divergence whose tokens are closer is a near-tie
    kv_pressure: tuple[str, ...] = ("num_kv_pages=64",)
    slot_pressure: tuple[str, ...] = ("decode_buckets=1,2,4,8", "decode_order=turns")
    prompt_file: str = PROMPT_FILE

    def __post_init__(self) -> None:
        unknown = [s for s in self.sweeps if s not in SWEEPS]
        if unknown or not self.sweeps or len(set(self.sweeps)) != len(self.sweeps):
            raise ValueError(f"--sweep {','.join(self.sweeps)!r}: give each of "
                             f"{', '.join(SWEEPS)} at most once"
                             + (f" ({', '.join(map(repr, unknown))} is not a sweep)"
                                if unknown else ""))
        counts = ("prompts", "max_tokens", "concurrency", "slot_concurrency")
        for name in counts + (("seeded_concurrency",) if self.seeded_concurrency is not None
                              else ()):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                unset = " (or null: concurrency's)" if name == "seeded_concurrency" else ""
                raise ValueError(f"{name.replace('_', '-')} must be an integer >= 1{unset}, "
                                 f"got {value!r}")
        if self.logprobs is not None and not (
                isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be null or 0..{MAX_LOGPROBS}, got {self.logprobs!r}")
        if not isinstance(self.near_tie, (int, float)) or not (
                math.isfinite(self.near_tie) and self.near_tie >= 0):
            raise ValueError(f"near-tie must be a number of nats >= 0, got {self.near_tie!r}")
        for name in ("kv_pressure", "slot_pressure"):
            split_knobs(list(getattr(self, name)), [])  # knob=value each, or a ValueError

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> CheckConfig:
        """From YAML or option values, keyed by field (or `sweep`, the option's name): lists
        may come as comma-separated text."""
        values = dict(values)
        if "sweep" in values:
            values["sweeps"] = values.pop("sweep")
        for name in ("sweeps", "kv_pressure", "slot_pressure"):
            if name in values:
                values[name] = _listed(name, values[name], split=name == "sweeps")
        return cls(**values)

    def knobs(self, name: str) -> dict[str, str]:
        """The knobs of `kv_pressure` or `slot_pressure` as a mapping."""
        return split_knobs(list(getattr(self, name)), [])[""]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- the prompts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptSet:
    """The prompts every arm gets, in order, and where they came from."""

    path: str
    texts: tuple[str, ...]
    sources: tuple[str, ...]

    @property
    def digest(self) -> str:
        return hashlib.sha256("\0".join(self.texts).encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "count": len(self.texts), "sha256": self.digest}

    def with_preamble(self) -> tuple[str, ...]:
        """The prompts each opened by one shared preamble, the first prompt (the prefix
        sweep's: a prefix cache can hit on a first pass too)."""
        return tuple(f"{self.texts[0]}\n\n{text}" for text in self.texts)


def load_prompts(repo: Path, check: CheckConfig) -> PromptSet:
    """The first `check.prompts` entries of the prompt file (relative to the repository)."""
    path = Path(check.prompt_file)
    path = path if path.is_absolute() else repo / path
    if not path.is_file():
        raise ValueError(f"prompt_file {check.prompt_file}: no such file")
    entries = (yaml.safe_load(path.read_text()) or {}).get("prompts")
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("text"), str) and e["text"] for e in entries):
        raise ValueError(f"prompt_file {check.prompt_file}: expected 'prompts:', a list of "
                         f"{{source, text}} with non-empty text")
    if len(entries) < check.prompts:
        raise ValueError(f"--prompts {check.prompts}: {check.prompt_file} holds only "
                         f"{len(entries)}")
    chosen = entries[:check.prompts]
    return PromptSet(check.prompt_file, tuple(e["text"] for e in chosen),
                     tuple(str(e.get("source", "")) for e in chosen))


# -- launches -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """The prompts sent once to a server at a concurrency; named after the sweep it serves
    (`slot-pressure` for the rows sweep's own)."""

    name: str
    concurrency: int
    seeded: bool = False  # SEEDED_SAMPLING with a seed a prompt; else greedy
    preamble: bool = False  # the prompts opened by a shared preamble (PromptSet.with_preamble)
    # prompt i capped at max_tokens - (i % 4) * max_tokens // 4, so rows leave a batch out of
    # order even without EOS (equal caps run them in lockstep)
    varied: bool = False

    def caps(self, max_tokens: int, count: int) -> tuple[int, ...]:
        """Each prompt's max_tokens."""
        if not self.varied:
            return (max_tokens,) * count
        return tuple(max(1, max_tokens - (i % 4) * max_tokens // 4) for i in range(count))


@dataclass(frozen=True)
class Launch:
    """One server per arm with these knobs (beside the arm's own), serving these loads."""

    name: str
    knobs: dict[str, str]
    loads: tuple[Load, ...]
    yardstick: bool  # whether the baseline's second server runs it too
    head_knobs: dict[str, str] = dataclasses.field(default_factory=dict)  # the heads' alone


def plan_launches(check: CheckConfig) -> list[Launch]:
    """The launches the chosen sweeps need, in the order they run."""
    sweeps = set(check.sweeps)
    launches = []
    plain = [Load(name, c, seeded=name == "seeded", varied=name == "concurrency")
             for name, c in (("greedy", 1), ("concurrency", check.concurrency),
                             ("seeded", check.seeded_concurrency or check.concurrency))
             if name in sweeps]
    if plain:
        launches.append(Launch("plain", {}, tuple(plain), yardstick=True))
    # every load's tokens are judged against the baseline's under the same pressure, the
    # yardstick beside: the row check alone misses a wrong row the host also got wrong
    if sweeps & {"kv-pressure", "rows"}:
        launches.append(Launch("kv-pressure", {**check.knobs("kv_pressure"), "row_check": "on"},
                               (Load("kv-pressure", check.concurrency),), yardstick=True))
    if "rows" in sweeps:
        launches.append(Launch("slot-pressure",
                               {**check.knobs("slot_pressure"), "row_check": "on"},
                               (Load("slot-pressure", check.slot_concurrency),),
                               yardstick=True))
    if "prefix" in sweeps:
        off, first, again = (Load(name, check.concurrency, preamble=True, varied=True)
                             for name in PREFIX_LOADS)
        # the heads' cache off by name, whatever their default (the baseline's by its own)
        launches.append(Launch("prefix-off", {}, (off,), yardstick=True,
                               head_knobs={"prefix_cache": "off"}))
        launches.append(Launch("prefix-on", {}, (first, again), yardstick=True,
                               head_knobs=dict(PREFIX_KNOBS)))
    return launches
