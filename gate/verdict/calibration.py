"""The verdict rule's error rates, measured by simulating sessions through the rule's own code.

A synthetic session draws each arm's log tok/s in each round as round + arm + noise: the round
term is shared by the round's arms (it cancels in the pairing, as the hour's state does), the
noise is independent across arms and rounds with sd NOISE / sqrt(2), so one round's paired delta
(arm against baseline) has sd NOISE. NOISE_LEVELS are those measured on the H200: 0.2% at c=1,
5% to 17% at c=64. The arm judged is slower by each of EFFECTS (0: it is a copy of the baseline,
so any `faster`/`slower` is false); with an A/A arm, a second copy of the baseline joins the
noise model as it does in a session. Runs within a round are not drawn: the rule sees one
number per arm and round, and NOISE is that number's paired spread. Each scenario has its own
seed, fixed, so the numbers are reproducible and paired.md can carry them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from gate.verdict.rule import FASTER, SLOWER, UNDECIDED, WITHIN, Design, decide

NOISE_LEVELS = (0.002, 0.05, 0.17)
EFFECTS = (0.0, 0.01, 0.02, 0.035, 0.05)
SESSIONS = 2000
SEED = 21
TAILS = ("normal", "t3")  # t3: Student's t with 3 degrees of freedom, scaled to the same sd


@dataclass(frozen=True)
class Scenario:
    """Sessions of `rounds` rounds (max_rounds under an until_verdict design) with `noise` and
    the arm slower by `effect`."""

    design: Design
    rounds: int
    noise: float
    effect: float
    aa: bool
    tails: str = "normal"

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.noise <= 0 or not 0 <= self.effect < 1:
            raise ValueError(f"rounds >= 1, noise > 0 and effect in [0, 1) expected: {self}")
        if self.tails not in TAILS:
            raise ValueError(f"tails must be one of {TAILS}, got {self.tails!r}")


@dataclass(frozen=True)
class Rates:
    """Shares of simulated sessions by verdict, and the rounds they ran on average."""

    slower: float
    faster: float
    within: float
    undecided: float
    mean_rounds: float

    @property
    def false_rate(self) -> float:
        """The share of `faster` or `slower`: false when the arm is a copy of the baseline."""
        return self.slower + self.faster


def draw(scenario: Scenario, sessions: int, rng: np.random.Generator) -> np.ndarray:
    """(sessions, rounds, arms) log tok/s: arm 0 the baseline, 1 the arm, 2 the A/A arm."""
    arms = 3 if scenario.aa else 2
    shape = (sessions, scenario.rounds, arms)
    scale = scenario.noise / math.sqrt(2)
    if scenario.tails == "normal":
        noise = rng.standard_normal(shape) * scale
    else:  # t with 3 df has variance 3
        noise = rng.standard_t(3, shape) * scale / math.sqrt(3)
    hour = rng.standard_normal((sessions, scenario.rounds, 1)) * 0.1
    values = math.log(1000.0) + hour + noise
    values[:, :, 1] += math.log1p(-scenario.effect)
    return values


def simulate(scenario: Scenario, sessions: int = SESSIONS, seed: int = SEED) -> Rates:
    """Runs `sessions` synthetic sessions of the scenario through the rule (gate.rule.decide)."""
    key = [seed, round(scenario.noise * 1e4), round(scenario.effect * 1e4), scenario.rounds,
           int(scenario.aa), TAILS.index(scenario.tails)]
    values = draw(scenario, sessions, np.random.default_rng(key))
    judged = decide(values, scenario.design)
    share = {code: float(np.mean(judged.code == code))
             for code in (SLOWER, FASTER, WITHIN, UNDECIDED)}
    return Rates(share[SLOWER], share[FASTER], share[WITHIN], share[UNDECIDED],
                 float(judged.rounds.mean()))


@functools.lru_cache(maxsize=32)
def error_table(design: Design, rounds: int, aa: bool) -> tuple[tuple[float, tuple[Rates, ...]],
                                                                 ...]:
    """For each of NOISE_LEVELS, the Rates at each of EFFECTS (normal noise)."""
    return tuple((noise, tuple(simulate(Scenario(design, rounds, noise, effect, aa))
                               for effect in EFFECTS)) for noise in NOISE_LEVELS)


def _percent(share: float) -> str:
    return f"{share * 100:.1f}%"


def error_table_rows(design: Design, rounds: int, aa: bool) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows as text: per noise level, the false faster/slower rate and
    the `within noise` rate of an A/A arm, then the `slower` rate for each effect; under
    until_verdict each cell adds the mean rounds run."""
    header = ["noise", "false faster/slower", "within noise",
              *(f"slower at -{effect * 100:g}%" for effect in EFFECTS[1:])]
    rows = []
    for noise, rates in error_table(design, rounds, aa):
        def cell(text: str, rate: Rates) -> str:
            return f"{text} ({rate.mean_rounds:.1f} r)" if design.until_verdict else text
        null = rates[0]
        rows.append([f"{noise * 100:g}%", cell(_percent(null.false_rate), null),
                     _percent(null.within),
                     *(cell(_percent(rate.slower), rate) for rate in rates[1:])])
    return header, rows
