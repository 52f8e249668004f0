"""The verdict rule: two tests over rounds, one arm against the baseline in one cell.

The round is the unit: in a round an arm and the baseline share an Inductor cache, a prompt
seed and the host's state at that hour, while the runs within a round share one server, so they
are not independent replicates of it. Each arm's value in a round is log(median tok/s over its ok
runs there), or where the round's servers ran side by side with their runs alternating
(`--interleave`), its median over the round's slots of log tok/s less the slot's mean over the
arms compared (gate/verdict/stats.py `round_table`): the rule below is the same either way.

- The t rule (new): a randomized complete block design with rounds as blocks. The arms in it are
  the baseline, the arm judged and, when `--aa` ran, the A/A arm (a second copy of the baseline):
  log tok/s = round + arm + noise, the noise independent with one variance across arms and
  rounds. The A/A arm's rounds join the noise estimate: the residual has (n-1)(K-1) degrees of
  freedom for n rounds and K arms, so an A/A arm doubles them. The arm's effect is the mean of its
  per-round log ratios to the baseline, its standard error sqrt(2 s^2 / n); the confidence
  interval is Student's t at those degrees of freedom.
- The sign rule (kept): the exact two-sided sign test over the per-round deltas, with the median
  delta beyond max(min effect, the A/A spread: the A/A arm's largest |delta| in the cell).

Verdicts, with m the min effect (1% unless the session set another):
- `faster` / `slower`: the t rule's interval lies above / below 0 and its estimate beyond +m / -m,
  or the sign rule's p is under its alpha with the median beyond its threshold;
- `within noise`: otherwise, when the t rule's interval lies inside (-m, +m);
- `too few rounds`: neither yet.

The false `faster`/`slower` rate allowed is ALPHA per arm and cell over the whole session,
shared by the two rules (ALPHA_T and ALPHA_SIGN) and by the looks: a fixed number of rounds is
judged once; with --until-verdict the rule is applied after every round from FIRST_LOOK up to
--max-rounds, each look at 1/looks of each share (Bonferroni), and a cell's verdict is the first
look that decides it. By the union bound the session's false rate is then at most ALPHA whatever
the rounds' correlation, when each look's tests are calibrated; gate/verdict/calibration.py
measures it by simulating this very code.

Everything here works on arrays of many sessions at once, so the simulation and a report run the
same functions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
ALPHA_T = 0.04
ALPHA_SIGN = ALPHA - ALPHA_T
MIN_EFFECT = 0.01
FIRST_LOOK = 2  # rounds the t rule needs: one degree of freedom

# verdict codes, as judge returns them
UNDECIDED, FASTER, SLOWER, WITHIN = 0, 1, -1, 2
VERDICT_NAMES = {FASTER: "faster", SLOWER: "slower", WITHIN: "within noise",
                 UNDECIDED: "too few rounds"}
VERDICTS = tuple(VERDICT_NAMES.values())


@dataclass(frozen=True)
class Design:
    """How a session's rounds are judged: a fixed number once at the end, or (until_verdict)
    after every round from FIRST_LOOK up to max_rounds. min_effect is m above."""

    until_verdict: bool = False
    max_rounds: int = 0  # with until_verdict
    min_effect: float = MIN_EFFECT

    def __post_init__(self) -> None:
        if self.until_verdict and self.max_rounds < FIRST_LOOK:
            raise ValueError(f"--max-rounds must be >= {FIRST_LOOK} with --until-verdict, got "
                             f"{self.max_rounds}")
        if not 0 < self.min_effect < 1:
            raise ValueError(f"--min-effect must be a fraction in (0, 1), got {self.min_effect}")

    @property
    def looks(self) -> int:
        return self.max_rounds - FIRST_LOOK + 1 if self.until_verdict else 1

    @property
    def alpha_t(self) -> float:
        """The t rule's two-sided alpha at each look."""
        return ALPHA_T / self.looks

    @property
    def alpha_sign(self) -> float:
        """The sign rule's two-sided alpha at each look."""
        return ALPHA_SIGN / self.looks


FIXED = Design()  # a fixed number of rounds, judged once, at the default min effect


# ---- distributions ----

def t_two_sided_p(t: np.ndarray, df: int) -> np.ndarray:
    """P(|T| >= |t|) for Student's t with integer df >= 1, in closed form (Abramowitz and
    Stegun 26.7.3-4: A(t|df) = P(|T| < t) as a finite series in theta = atan(t / sqrt(df)))."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    theta = np.arctan(np.abs(np.asarray(t, dtype=float)) / math.sqrt(df))
    cos2 = np.cos(theta) ** 2
    if df % 2:  # odd: (2/pi)(theta + sin cos (1 + 2/3 cos^2 + (2.4)/(3.5) cos^4 + ...))
        term, series = np.ones_like(theta), np.zeros_like(theta)
        for k in range(1, (df - 1) // 2 + 1):
            series += term
            term = term * cos2 * (2 * k) / (2 * k + 1)
        inside = 2 / math.pi * (theta + np.sin(theta) * np.cos(theta) * series)
    else:  # even: sin (1 + 1/2 cos^2 + (1.3)/(2.4) cos^4 + ...)
        term, series = np.ones_like(theta), np.zeros_like(theta)
        for k in range(1, df // 2 + 1):
            series += term
            term = term * cos2 * (2 * k - 1) / (2 * k)
        inside = np.sin(theta) * series
    return np.clip(1.0 - inside, 0.0, 1.0)


@functools.lru_cache(maxsize=512)
def t_critical(alpha: float, df: int) -> float:
    """The t with P(|T| >= t) = alpha (df degrees of freedom), by bisection."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    low, high = 0.0, 1.0
    while t_two_sided_p(np.array(high), df) > alpha:
        low, high = high, high * 2
    for _ in range(200):
        middle = (low + high) / 2
        if t_two_sided_p(np.array(middle), df) > alpha:
            low = middle
        else:
            high = middle
    return high


@functools.lru_cache(maxsize=64)
def _sign_table(n: int) -> np.ndarray:
    """table[m, k]: the exact two-sided sign test's p for k signs of the rarer kind out of m."""
    table = np.ones((n + 1, n + 1))
    for m in range(1, n + 1):
        for k in range(m + 1):
            tail = sum(math.comb(m, j) for j in range(min(k, m - k) + 1))
            table[m, k] = min(1.0, 2 * tail / 2**m)
    return table


def sign_p(positives: np.ndarray, negatives: np.ndarray) -> np.ndarray:
    """Exact two-sided sign test (binomial, p = 1/2) over nonzero deltas; 1.0 for none."""
    positives, negatives = np.asarray(positives), np.asarray(negatives)
    total = positives + negatives
    table = _sign_table(int(total.max(initial=0)))
    return table[total, np.minimum(positives, negatives)]


# ---- the rule ----

@dataclass(frozen=True)
class Judgement:
    """A look's numbers for each session judged (arrays over sessions): `rounds` it judged.
    Ratios are arm / baseline - 1: `estimate` the t rule's (geometric mean), `ci_low`/`ci_high`
    its interval at the look's alpha; `median_delta` the sign rule's; `rule` says which rule
    gave a faster or slower verdict ("t", "sign", "t+sign", "")."""

    code: np.ndarray
    rounds: np.ndarray
    estimate: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    p_t: np.ndarray
    median_delta: np.ndarray
    p_sign: np.ndarray
    sign_threshold: np.ndarray
    rule: np.ndarray


def _t_rule(log_tok_s: np.ndarray, alpha: float):
    """(estimate, ci_low, ci_high, p) in log ratio, from (sessions, rounds, arms) log tok/s
    whose arm 0 is the baseline and arm 1 the arm judged."""
    _, rounds, arms = log_tok_s.shape
    df = (rounds - 1) * (arms - 1)
    estimate = (log_tok_s[:, :, 1] - log_tok_s[:, :, 0]).mean(axis=1)
    residual = (log_tok_s - log_tok_s.mean(axis=1, keepdims=True)
                - log_tok_s.mean(axis=2, keepdims=True)
                + log_tok_s.mean(axis=(1, 2), keepdims=True))
    stderr = np.sqrt(2 * (residual**2).sum(axis=(1, 2)) / df / rounds)
    half = t_critical(alpha, df) * stderr
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(stderr > 0, t_two_sided_p(estimate / stderr, df),
                     np.where(estimate == 0, 1.0, 0.0))
    return estimate, estimate - half, estimate + half, p


def _sign_rule(log_tok_s: np.ndarray, min_effect: float):
    """(median delta, p, threshold): the threshold is max(min_effect, the A/A arm's largest
    |delta|) when arm 2 is the A/A arm, else min_effect."""
    deltas = np.expm1(log_tok_s[:, :, 1] - log_tok_s[:, :, 0])
    p = sign_p((deltas > 0).sum(axis=1), (deltas < 0).sum(axis=1))
    threshold = np.full(len(deltas), min_effect)
    if log_tok_s.shape[2] > 2:
        spread = np.abs(np.expm1(log_tok_s[:, :, 2] - log_tok_s[:, :, 0])).max(axis=1)
        threshold = np.maximum(threshold, spread)
    return np.median(deltas, axis=1), p, threshold


def judge(log_tok_s: np.ndarray, design: Design) -> Judgement:
    """One look at (sessions, rounds, arms) log tok/s: arm 0 the baseline, arm 1 the arm
    judged, an arm 2 the A/A arm (the noise model's); rounds >= FIRST_LOOK."""
    sessions, rounds, arms = log_tok_s.shape
    if rounds < FIRST_LOOK or arms not in (2, 3):
        raise ValueError(f"judge needs >= {FIRST_LOOK} rounds and 2 or 3 arms, got "
                         f"{rounds} and {arms}")
    estimate, low, high, p_t = _t_rule(log_tok_s, design.alpha_t)
    median, p_sign, threshold = _sign_rule(log_tok_s, design.min_effect)
    floor_low, floor_high = math.log1p(-design.min_effect), math.log1p(design.min_effect)
    by_t = {FASTER: (low > 0) & (estimate > floor_high),
            SLOWER: (high < 0) & (estimate < floor_low)}
    signed = p_sign < design.alpha_sign
    by_sign = {FASTER: signed & (median > threshold), SLOWER: signed & (median < -threshold)}
    faster = by_t[FASTER] | by_sign[FASTER]
    slower = by_t[SLOWER] | by_sign[SLOWER]
    within = (low > floor_low) & (high < floor_high)
    code = np.select([faster & ~slower, slower & ~faster, within & ~faster & ~slower],
                     [FASTER, SLOWER, WITHIN], UNDECIDED)
    t_fired = (by_t[FASTER] | by_t[SLOWER]) & (code != WITHIN) & (code != UNDECIDED)
    sign_fired = (by_sign[FASTER] | by_sign[SLOWER]) & (code != WITHIN) & (code != UNDECIDED)
    rule = np.select([t_fired & sign_fired, t_fired, sign_fired], ["t+sign", "t", "sign"], "")
    return Judgement(code, np.full(sessions, rounds), np.expm1(estimate), np.expm1(low),
                     np.expm1(high), p_t, median, p_sign, threshold, rule)


def _empty(sessions: int, rounds: int) -> Judgement:
    nan = np.full(sessions, np.nan)
    return Judgement(np.full(sessions, UNDECIDED), np.full(sessions, rounds), nan, nan, nan,
                     np.ones(sessions), nan, np.ones(sessions), nan, np.full(sessions, ""))


def decide(log_tok_s: np.ndarray, design: Design) -> Judgement:
    """The verdicts of (sessions, rounds, arms) log tok/s under `design`: one look at every
    round for a fixed design; with until_verdict, each session's first deciding look (rounds
    FIRST_LOOK, FIRST_LOOK+1, ... up to what it holds and max_rounds), else its last; `rounds`
    says which. A session with fewer than FIRST_LOOK rounds is undecided."""
    sessions, rounds, _ = log_tok_s.shape
    if rounds < FIRST_LOOK:
        return _empty(sessions, rounds)
    if not design.until_verdict:
        return judge(log_tok_s, design)
    last = min(rounds, design.max_rounds)
    looks = [judge(log_tok_s[:, :n], design) for n in range(FIRST_LOOK, last + 1)]
    first = np.full(sessions, len(looks) - 1)
    for index in reversed(range(len(looks))):
        first = np.where(looks[index].code != UNDECIDED, index, first)
    return _pick(looks, first)


def _pick(looks: list[Judgement], index: np.ndarray) -> Judgement:
    """For each session, the judgement of the look `index` names."""
    sessions = np.arange(len(index))
    return Judgement(**{name: np.stack([getattr(look, name) for look in looks])[index, sessions]
                        for name in JUDGEMENT_FIELDS})


JUDGEMENT_FIELDS = tuple(field.name for field in dataclasses.fields(Judgement))
