"""The gate's statistics: run records as a frame, per-round paired deltas, and each cell's
verdicts by the rule of gate/verdict/rule.py.

Arms are compared paired by round: in each round an arm and the baseline share an Inductor
cache, a prompt seed and the host's state at that hour, so the per-round ratio removes what
differs between rounds. In an interleaved session (--interleave) they are paired within a round
too, slot by slot: run j of every arm ran back to back, so the host's speed at that moment
cancels in their ratio.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from gate.manifest import Manifest
from gate.metrics import ServeMetrics
from gate.records import GpuSample, RunRecord
from gate.verdict import rule

_GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuSample))
METRIC_FIELDS = tuple(f.name for f in dataclasses.fields(ServeMetrics))
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(RunRecord)
                       if f.name not in ("gpu", "metrics"))
ENGINE_KINDS = ("decode", "prefill", "mixed")  # step_ms kinds with a column: engine_<kind>_ms
CORE_PARTS = ("queue", "prefill", "ttft")  # core_ms parts with a column: core_<part>_ms
_NUMBER_COLUMNS = (*(f"engine_{kind}_ms" for kind in ENGINE_KINDS),
                   *(f"core_{part}_ms" for part in CORE_PARTS))
RUN_COLUMNS = ("cell", *_RECORD_FIELDS, *METRIC_FIELDS,
               *(f"gpu_{name}" for name in _GPU_FIELDS), *_NUMBER_COLUMNS)
PAIRED_COLUMNS = ("cell", "concurrency", "arm", "round", "arm_value", "base_value", "delta")
THROUGHPUT = "output_throughput"  # output tok/s of a run
# The column the verdicts judge, higher is faster: a run's output tok/s in a closed loop; in an
# open loop (requests arriving at a set rate) tok/s is the arrival rate whatever the arms do,
# so a run's first tokens a second at its median, 1000 / TTFT p50 ms
JUDGED = "judged"
MEASURES = {"tok/s": "output tok/s",
            "ttft": "1000 / TTFT p50 ms (first tokens a second at the median: higher is a "
                    "lower TTFT)"}
PLANNER_OFF = " (planner off!)"  # appended to a flagged arm's name in every table
VERDICT_COLUMNS = ("cell", "arm", "rounds", "decided_at", "noise_arms", "estimate", "ci_low",
                   "ci_high", "p_t", "median_delta", "p_sign", "sign_threshold", "rule",
                   "verdict")


def cell_order(frame: pd.DataFrame, manifest: Manifest) -> list[str]:
    """Cells ("c=16") in the manifest's order, then any others the runs hold, by concurrency."""
    cells = [f"c={c}" for c in manifest.cells]
    extra = sorted(set(frame["concurrency"]) - set(manifest.cells))
    return cells + [f"c={c}" for c in extra]


def arm_order(frame: pd.DataFrame, manifest: Manifest) -> list[str]:
    """Arms in the manifest's order (the A/A arm after them if unlisted), then unlisted arms."""
    names = manifest.arm_names
    for name in [manifest.aa_arm, *frame["arm"]]:
        if name and name not in names:
            names.append(name)
    return names


def planner_off_arms(frame: pd.DataFrame, manifest: Manifest) -> set[str]:
    """Arms flagged planner_off in the manifest or in any of their runs."""
    return manifest.planner_off_arms | set(frame.loc[frame["planner_off"], "arm"])


def _record_row(record: RunRecord) -> dict:
    row = {name: getattr(record, name) for name in _RECORD_FIELDS}
    row.update({name: getattr(record.metrics, name, None) for name in METRIC_FIELDS})
    gpu = record.gpu or GpuSample()
    row.update({f"gpu_{name}": getattr(gpu, name) for name in _GPU_FIELDS})
    row.update({f"engine_{kind}_ms": record.step_ms.get(kind) for kind in ENGINE_KINDS})
    row.update({f"core_{part}_ms": record.core_ms.get(part) for part in CORE_PARTS})
    row["cell"] = record.cell
    return row


def measure_of(manifest: Manifest) -> str:
    """What the session's verdicts judge (a MEASURES key): `ttft` for an open loop."""
    return "ttft" if manifest.request_rate else "tok/s"


def runs_frame(records: Iterable[RunRecord], measure: str = "tok/s") -> pd.DataFrame:
    """One row per run record, `metrics` flattened to its ServeMetrics field names, `gpu` to
    `gpu_<field>` columns, the server's mean decode, prefill and mixed step to
    `engine_<kind>_ms`, the engine core's mean TTFT parts to `core_<part>_ms`, plus `cell`
    ("c=16") and JUDGED, the run's value of `measure` (MEASURES).

    Numbers a run lacks are NaN; `steps`, `step_ms` and `core_ms` stay dicts per row.
    """
    frame = pd.DataFrame([_record_row(r) for r in records], columns=list(RUN_COLUMNS))
    numeric = [*METRIC_FIELDS, "sibling_busy_cpus", "api_cpu_s", "core_cpu_s", "client_cpu_s",
               "num_clients", *(f"gpu_{name}" for name in _GPU_FIELDS), *_NUMBER_COLUMNS]
    frame[numeric] = frame[numeric].astype(float)
    frame["ok"] = frame["ok"].astype(bool)
    frame["planner_off"] = frame["planner_off"].astype(bool)
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}: one of {', '.join(MEASURES)}")
    frame[JUDGED] = frame[THROUGHPUT] if measure == "tok/s" else 1000.0 / frame["median_ttft_ms"]
    return frame


def _measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The ok runs with a judged value: what a round's value is made of."""
    return frame[frame["ok"] & frame[JUDGED].notna()]


def _round_medians(frame: pd.DataFrame) -> pd.DataFrame:
    return _measured(frame).groupby(["concurrency", "arm", "round"],
                                    as_index=False)[JUDGED].median()


def _judged(frame: pd.DataFrame, baseline: str) -> Iterable[tuple[int, str]]:
    """(concurrency, arm) for each cell and each arm besides the baseline with runs in it."""
    for concurrency in sorted(set(frame["concurrency"])):
        for arm in sorted(set(frame.loc[frame["concurrency"] == concurrency, "arm"]) - {baseline}):
            yield concurrency, arm


def by_slot(manifest: Manifest) -> bool:
    """Whether the session's rounds are summarised slot by slot: its servers of a round ran
    side by side, the arms' runs alternating (--interleave)."""
    return manifest.interleave


def paired_deltas(frame: pd.DataFrame, baseline: str, slots: bool = False) -> pd.DataFrame:
    """Per cell and round, each non-baseline arm's median judged value (tok/s, or in an open
    loop 1000 / TTFT p50) against the baseline's.

    delta = arm / base - 1 (a fraction): the ratio of the round's medians, or with `slots`
    (by_slot) the median over the round's slots of the arm's run against the baseline's run
    beside it. Rounds where either side has no ok run (with `slots`: no slot where both have
    one) are left out. Sorted by concurrency, arm, round.
    """
    medians = _round_medians(frame)
    base = medians[medians["arm"] == baseline].drop(columns="arm")
    base = base.rename(columns={JUDGED: "base_value"})
    arms = medians[medians["arm"] != baseline].rename(columns={JUDGED: "arm_value"})
    paired = arms.merge(base, on=["concurrency", "round"], how="inner")
    if slots:
        paired = paired.merge(_slot_deltas(frame, baseline), on=["concurrency", "arm", "round"],
                              how="inner")
    else:
        paired["delta"] = paired["arm_value"] / paired["base_value"] - 1.0
    paired["cell"] = [f"c={c}" for c in paired["concurrency"]]
    paired = paired.sort_values(["concurrency", "arm", "round"], kind="stable")
    return paired[list(PAIRED_COLUMNS)].reset_index(drop=True)


def _slot_deltas(frame: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """concurrency, arm, round, delta: each arm's slot-paired delta against the baseline."""
    rows = []
    for concurrency, arm in _judged(frame, baseline):
        table = round_table(frame, concurrency, [baseline, arm], slots=True)
        rows += [{"concurrency": concurrency, "arm": arm, "round": index,
                  "delta": math.expm1(values[arm] - values[baseline])}
                 for index, values in table.iterrows()]
    return pd.DataFrame(rows, columns=["concurrency", "arm", "round", "delta"])


def sign_test_p(deltas: Iterable[float]) -> float:
    """Exact two-sided sign test (binomial, p = 0.5) over the deltas' signs; zeros are dropped.

    p = min(1, 2 * P[X <= min(positives, negatives)]) with X ~ Binomial(n, 1/2); 1.0 for n = 0.
    """
    values = np.asarray(list(deltas), dtype=float)
    return float(rule.sign_p(np.array([(values > 0).sum()]), np.array([(values < 0).sum()]))[0])


def design_of(manifest: Manifest) -> rule.Design:
    """How the session's rounds are judged, from its manifest (a session from before
    --until-verdict ran a fixed number)."""
    return rule.Design(until_verdict=manifest.until_verdict,
                       max_rounds=manifest.max_rounds or 0,
                       min_effect=manifest.min_effect or rule.MIN_EFFECT)


def round_table(frame: pd.DataFrame, concurrency: int, arms: list[str],
                slots: bool = False) -> pd.DataFrame:
    """Each arm's value in each round of the cell (rows: rounds in order, columns: `arms`), over
    the rounds where every one of `arms` has an ok run: the log of its median JUDGED value
    (tok/s, or an open loop's 1000 / TTFT p50) over its ok runs; with `slots` (by_slot) its
    median over the round's slots (a run number: one run of every arm, back to back) of its
    run's log value less the slot's mean over `arms`, over the slots where each of `arms` has
    an ok run. A round's level cancels in the rule's contrasts either way; by slot, so does the
    host's speed at each moment of the round."""
    if not slots:
        medians = _round_medians(frame)
        in_cell = medians[medians["concurrency"] == concurrency]
        table = in_cell.pivot(index="round", columns="arm", values=JUDGED)
        return np.log(table.reindex(columns=arms).dropna().sort_index())
    ok = _measured(frame)
    ok = ok[ok["concurrency"] == concurrency]
    logs = np.log(ok.pivot(index=["round", "run"], columns="arm", values=JUDGED))
    logs = logs.reindex(columns=arms).dropna()
    centred = logs.sub(logs.mean(axis=1), axis=0)
    return centred.groupby(level="round").median().sort_index()


def round_values(frame: pd.DataFrame, concurrency: int, arms: list[str],
                 slots: bool = False) -> np.ndarray:
    """(rounds, len(arms)): round_table as an array, the rule's input."""
    return round_table(frame, concurrency, arms, slots).to_numpy(dtype=float)


def _model_arms(frame: pd.DataFrame, concurrency: int, baseline: str, arm: str,
                aa_arm: str | None) -> list[str]:
    """The arms of the t rule's design for `arm`: the baseline and the arm, and the A/A arm when
    it ran in this cell and is not the arm judged."""
    ran = set(frame.loc[(frame["concurrency"] == concurrency) & frame["ok"], "arm"])
    noise = [aa_arm] if aa_arm and aa_arm != arm and aa_arm in ran else []
    return [baseline, arm, *noise]


def _verdict_row(cell: str, arm: str, values: np.ndarray, noise_arms: list[str],
                 design: rule.Design) -> dict[str, Any]:
    judged = rule.decide(values[np.newaxis], design)
    number = {name: float(getattr(judged, name)[0])
              for name in ("estimate", "ci_low", "ci_high", "p_t", "median_delta", "p_sign",
                           "sign_threshold")}
    return {"cell": cell, "arm": arm, "rounds": len(values),
            "decided_at": int(judged.rounds[0]), "noise_arms": ",".join(noise_arms), **number,
            "rule": str(judged.rule[0]), "verdict": rule.VERDICT_NAMES[int(judged.code[0])]}


def undecided(frame: pd.DataFrame, manifest: Manifest) -> list[str]:
    """"c=N arm" for each cell of the manifest and arm besides the baseline whose verdict is
    still `too few rounds` under the session's design."""
    baseline = manifest.baseline
    table = verdicts(frame, baseline, manifest.aa_arm, design_of(manifest), by_slot(manifest))
    arms = [arm for arm in arm_order(frame, manifest) if arm != baseline]
    return [f"{cell} {arm}" for cell in cell_order(frame, manifest) for arm in arms
            if verdict_of(table, cell, arm)["verdict"] == "too few rounds"]


def verdict_of(verdicts: pd.DataFrame, cell: str, arm: str) -> dict[str, Any]:
    """The verdict row of `arm` in `cell`; an arm with no run there is `too few rounds`."""
    hit = verdicts[(verdicts["cell"] == cell) & (verdicts["arm"] == arm)]
    if len(hit):
        return hit.iloc[0].to_dict()
    return {**dict.fromkeys(VERDICT_COLUMNS, math.nan), "cell": cell, "arm": arm, "rounds": 0,
            "decided_at": 0, "noise_arms": "", "rule": "", "verdict": "too few rounds"}


def verdicts(frame: pd.DataFrame, baseline: str, aa_arm: str | None = None,
             design: rule.Design = rule.FIXED, slots: bool = False) -> pd.DataFrame:
    """One verdict row per cell and arm with runs in it, the A/A arm included
    (gate/verdict/rule.py).

    Columns VERDICT_COLUMNS: `rounds` the rounds the rule judged (those where the baseline, the
    arm and, when it ran, the A/A arm all have an ok run), `decided_at` the rounds at the look
    that gave the verdict, `noise_arms` the A/A arm when it joined the noise model, then the
    t rule's estimate, interval and p and the sign rule's median delta, p and threshold (ratios
    arm / baseline - 1), `rule` which rule gave a faster or slower verdict, and `verdict`.
    Arms with no run in a cell have no row there; callers treat them as `too few rounds`.
    """
    rows = []
    for concurrency, arm in _judged(frame, baseline):
        arms = _model_arms(frame, concurrency, baseline, arm, aa_arm)
        values = round_values(frame, concurrency, arms, slots)
        rows.append(_verdict_row(f"c={concurrency}", arm, values, arms[2:], design))
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
