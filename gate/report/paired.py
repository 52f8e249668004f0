"""paired.md: the verdict rule and its simulated error rates for the session's design, then per
cell the per-round deltas and each arm's verdict with the numbers behind it."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

from gate.manifest import Manifest
from gate.report.markdown import arms_line, fmt_pct, label, md_table, page_title, round_label
from gate.verdict import calibration, rule, stats

PAIRED_FILE = "paired.md"


VALUE_BY_MEDIAN = "an arm's value in a round is the median {what} over its ok runs there"
VALUE_BY_SLOT = (
    "the round's servers ran side by side (`--interleave`), slot j holding run j of every arm "
    "back to back, so an arm's value in a round is the median over the round's slots of its "
    "run's log {what} less the slot's mean over the arms compared (slots where one of them has "
    "no ok run are left out): a drift of the host's speed within the round reaches every arm "
    "of a slot alike and cancels")


def rule_text(design: rule.Design, slots: bool = False, measure: str = "tok/s") -> str:
    """The rule, why it is built so, and how the A/A arm enters; `design`'s min effect;
    `slots`: the session's rounds are summarised slot by slot (stats.by_slot); `measure`: what
    it judges (stats.MEASURES)."""
    floor = f"{design.min_effect * 100:g}%"
    what = stats.MEASURES[measure]
    value = (VALUE_BY_SLOT if slots else VALUE_BY_MEDIAN).format(what=what)
    if measure != "tok/s":
        value += (" (requests arrived at a set rate, so tok/s is that rate whatever the arms "
                  "do: the verdicts judge TTFT; `faster` is a lower TTFT p50)")
    return (
        f"**Rule.** Paired by round: {value}; the round "
        "is the unit (its arms share an Inductor cache, a prompt seed and the hour; the runs "
        "within it share one server, so they are not independent). "
        f"Two rules share a false `faster`/`slower` rate of {rule.ALPHA:.0%} per arm and cell "
        "over the session:\n\n"
        "1. *t rule*: the rounds where the baseline, the arm and, when `--aa` ran, the A/A arm "
        "all have an ok run form a block design, log value = round + arm + noise. The arm's "
        "estimate is the geometric mean of its per-round ratios to the baseline, with a "
        "Student-t interval whose noise is estimated from the residuals of every arm in the "
        "design. **The A/A arm's rounds are the noise model**: with `--aa` they add n-1 "
        "degrees of freedom to the arm's own (n rounds); without `--aa` the noise is the "
        "arm's own round-to-round spread alone (a paired t-test over rounds, n-1 degrees of "
        f"freedom). `faster`/`slower` when the interval excludes 0 and the estimate is beyond "
        f"±{floor}.\n"
        "2. *sign rule* (the gate's first rule, kept): the exact two-sided sign test over the "
        f"per-round deltas, `faster`/`slower` when its p is under its alpha and the median "
        f"delta is beyond max({floor}, the A/A arm's largest |delta| in the cell).\n\n"
        f"`within noise` when neither fires and the t interval lies within ±{floor}; "
        "otherwise `too few rounds`. Why: the t rule uses the deltas' size, so a change several "
        "times the noise is called in 2 or 3 rounds where the sign test needs 6 of one sign; "
        f"the {floor} floor keeps out differences smaller than the gate resolves, such as the "
        "+0.1 to +0.2% an A/A copy read in every round on the H200 (an order effect no noise "
        "model sees); the sign rule keeps a verdict that assumes nothing of the noise's shape."
    )


def _share(fraction: float) -> str:
    return f"{fraction * 100:.3g}%"


def design_text(design: rule.Design, rounds: int) -> str:
    """How this session's rounds are judged, with each look's alphas."""
    alphas = (f"the t rule at alpha {_share(design.alpha_t)} (a {_share(1 - design.alpha_t)} "
              f"interval), the sign rule at {_share(design.alpha_sign)}")
    if design.until_verdict:
        return (f"This session ran until every cell had a verdict, at most {design.max_rounds} "
                f"rounds: the rule was applied after every round from round {rule.FIRST_LOOK}, "
                f"{design.looks} looks, each with 1/{design.looks} of both alphas ({alphas}); "
                "a cell's verdict is its first deciding look (`rounds` says which).")
    return f"This session's {rounds} rounds are judged once: {alphas}."


def error_rates_text(design: rule.Design, rounds: int, aa: bool) -> str:
    """The simulated error rates of the rule under this design (gate/verdict/calibration.py)."""
    header, rows = calibration.error_table_rows(design, rounds, aa)
    model = "the A/A arm in the noise model" if aa else "no A/A arm"
    rounds_note = (" Each cell adds the mean rounds run to the verdict (r)."
                   if design.until_verdict else "")
    return (f"Simulated error rates of this rule for this design ({model}): "
            f"{calibration.SESSIONS} synthetic sessions a cell through the rule's own code "
            f"(gate/verdict/calibration.py, seed {calibration.SEED}), normal noise whose sd for "
            "one "
            "round's paired delta is `noise` (the H200 measured 0.2% at c=1 and 5 to 17% at "
            "c=64). `false faster/slower` and `within noise` are an A/A arm's (the arm a copy of "
            f"the baseline); `slower at -x%` is the chance to call an arm slower by x%."
            f"{rounds_note}\n\n" + md_table(header, rows, "l" + "r" * (len(header) - 1)))


def _deltas_table(paired: pd.DataFrame, arms: list[str], flagged: set[str]) -> str | None:
    rounds = sorted(int(r) for r in set(paired["round"]))
    rows = []
    for arm in arms:
        of_arm = paired[paired["arm"] == arm]
        if of_arm.empty:
            continue
        by_round = dict(zip(of_arm["round"], of_arm["delta"], strict=True))
        rows.append([label(arm, flagged),
                     *(fmt_pct(by_round[r]) if r in by_round else "-" for r in rounds)])
    if not rows:
        return None
    return md_table(["arm", *(round_label(r) for r in rounds)], rows, "l" + "r" * len(rounds))


def _p(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}"


def _rounds_text(row: dict[str, Any]) -> str:
    rounds, decided = int(row["rounds"]), int(row["decided_at"])
    return f"{decided} of {rounds}" if decided < rounds else str(rounds)


def _verdict_table(verdicts: pd.DataFrame, cell: str, arms: list[str],
                   flagged: set[str]) -> str:
    header = ["cell", "arm", "rounds", "t: estimate [interval]", "p (t)", "sign: median delta",
              "p (sign)", "by", "verdict"]
    body = []
    for arm in arms:
        row = stats.verdict_of(verdicts, cell, arm)
        interval = (f"{fmt_pct(row['estimate'])} [{fmt_pct(row['ci_low'])}, "
                    f"{fmt_pct(row['ci_high'])}]" if not math.isnan(row["estimate"]) else "-")
        body.append([cell, label(arm, flagged), _rounds_text(row), interval, _p(row["p_t"]),
                     fmt_pct(row["median_delta"]), _p(row["p_sign"]), row["rule"] or "-",
                     row["verdict"]])
    return md_table(header, body, "llrrrrrll")


def _paired_arms(paired: pd.DataFrame, verdicts: pd.DataFrame,
                 manifest: Manifest) -> list[str]:
    names = [*manifest.arm_names, manifest.aa_arm, *paired["arm"], *verdicts["arm"]]
    return [n for n in dict.fromkeys(names) if n and n != manifest.baseline]


def _paired_block(paired: pd.DataFrame, verdicts: pd.DataFrame, cell: str, arms: list[str],
                  flagged: set[str], slots: bool) -> str:
    deltas = _deltas_table(paired[paired["cell"] == cell], arms, flagged)
    deltas = deltas or ("No paired round: a round pairs only when both the arm and the "
                        "baseline have an ok run in it" + (" in one slot." if slots else "."))
    what = ("the median over the round's slots of arm / baseline - 1" if slots
            else "arm / baseline - 1")
    return "\n\n".join([f"## {cell}", f"Delta per round, {what}:", deltas,
                        _verdict_table(verdicts, cell, arms, flagged)])


def paired_md(paired: pd.DataFrame, verdicts: pd.DataFrame, manifest: Manifest,
              planner_off: Iterable[str] = ()) -> str:
    """The rule, this session's design and the rule's simulated error rates under it, then per
    cell the per-round deltas (arms x rounds) and the verdicts.

    Every non-baseline arm of the manifest gets a verdict row in every cell (`too few rounds`
    where it has no paired round). `planner_off` names arms to flag beyond the manifest's.
    """
    design = stats.design_of(manifest)
    rounds = design.max_rounds if design.until_verdict else (manifest.rounds or 0)
    flagged = manifest.planner_off_arms | set(planner_off)
    arms = _paired_arms(paired, verdicts, manifest)
    slots = stats.by_slot(manifest)
    parts = [page_title(manifest, "paired by round"),
             rule_text(design, slots, stats.measure_of(manifest)),
             design_text(design, rounds)]
    if rounds >= 1:
        parts.append(error_rates_text(design, rounds, bool(manifest.aa_arm)))
    parts.append(arms_line(manifest))
    if not arms:
        parts.append("No arm besides the baseline.")
    else:
        parts += [_paired_block(paired, verdicts, cell, arms, flagged, slots)
                  for cell in stats.cell_order(paired, manifest)]
    return "\n\n".join(parts) + "\n"
