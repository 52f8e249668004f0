"""The gate's statistics: run records as a frame, per-round paired deltas, and the verdict rule.

Arms are compared paired by round: in each round an arm and the baseline share an
Inductor cache, a prompt seed and the host's state at that hour, so the per-round ratio removes
what differs between rounds. Significance is an exact sign test over those ratios; the effect
must also clear the A/A spread (a second copy of the baseline against the baseline) when one ran.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

from gate.load import ServeMetrics
from gate.records import GpuSample, RunRecord

MIN_ROUNDS = 6
MIN_EFFECT = 0.01
ALPHA = 0.05

VERDICTS = ("faster", "slower", "within noise", "too few rounds")

RULE = (
    "Paired by round: in each round, an arm's median output tok/s over its ok runs is divided by "
    "the baseline's median in the same round, and delta = arm / baseline - 1; a round where "
    "either side has no ok run is left out. Each arm and cell gets exactly one verdict: "
    f"`faster`, `slower`, `within noise` or `too few rounds`. Fewer than {MIN_ROUNDS} paired "
    "rounds is `too few rounds`. Otherwise the verdict is `faster` or `slower` (by the sign of "
    "the median delta) only when the exact two-sided sign test over the rounds gives "
    f"p < {ALPHA} and |median paired delta| > threshold, where threshold = "
    f"max({MIN_EFFECT:.0%}, the A/A spread) and the A/A spread is the largest |paired delta| of "
    "the A/A arm (a second copy of the baseline, run when `--aa` is given) in that cell; "
    "anything else is `within noise`. "
    f"With {MIN_ROUNDS} rounds all of one sign the sign test gives p = 2/64 = 0.03125; "
    "with 5 its smallest p is 0.0625, hence the floor."
)

_GPU_FIELDS = tuple(f.name for f in dataclasses.fields(GpuSample))
METRIC_FIELDS = tuple(f.name for f in dataclasses.fields(ServeMetrics))
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(RunRecord)
                       if f.name not in ("gpu", "metrics"))
ENGINE_KINDS = ("decode", "prefill", "mixed")  # step_ms kinds with a column: engine_<kind>_ms
RUN_COLUMNS = ("cell", *_RECORD_FIELDS, *METRIC_FIELDS,
               *(f"gpu_{name}" for name in _GPU_FIELDS),
               *(f"engine_{kind}_ms" for kind in ENGINE_KINDS))
PAIRED_COLUMNS = ("cell", "concurrency", "arm", "round", "arm_tok_s", "base_tok_s", "delta")
THROUGHPUT = "output_throughput"  # the verdicts' measure: output tok/s of a run
PLANNER_OFF = " (planner off!)"  # appended to a flagged arm's name in every table
VERDICT_COLUMNS = ("cell", "arm", "rounds", "median_delta", "p_value", "threshold", "verdict")


def cell_order(frame: pd.DataFrame, manifest: dict[str, Any]) -> list[str]:
    """Cells ("c=16") in the manifest's order, then any others the runs hold, by concurrency."""
    cells = [f"c={c}" for c in manifest.get("cells") or []]
    extra = sorted(set(frame["concurrency"]) - set(manifest.get("cells") or []))
    return cells + [f"c={c}" for c in extra]


def arm_order(frame: pd.DataFrame, manifest: dict[str, Any]) -> list[str]:
    """Arms in the manifest's order (the A/A arm after them if unlisted), then unlisted arms."""
    names = [arm["name"] for arm in manifest.get("arms") or []]
    for name in [manifest.get("aa_arm"), *frame["arm"]]:
        if name and name not in names:
            names.append(name)
    return names


def manifest_planner_off(manifest: dict[str, Any]) -> set[str]:
    """Arms the manifest flags planner_off."""
    return {arm["name"] for arm in manifest.get("arms") or [] if arm.get("planner_off")}


def planner_off_arms(frame: pd.DataFrame, manifest: dict[str, Any]) -> set[str]:
    """Arms flagged planner_off in the manifest or in any of their runs."""
    return manifest_planner_off(manifest) | set(frame.loc[frame["planner_off"], "arm"])


def _record_row(record: RunRecord) -> dict:
    row = {name: getattr(record, name) for name in _RECORD_FIELDS}
    row.update({name: getattr(record.metrics, name, None) for name in METRIC_FIELDS})
    gpu = record.gpu or GpuSample()
    row.update({f"gpu_{name}": getattr(gpu, name) for name in _GPU_FIELDS})
    row.update({f"engine_{kind}_ms": record.step_ms.get(kind) for kind in ENGINE_KINDS})
    row["cell"] = record.cell
    return row


def runs_frame(records: Iterable[RunRecord]) -> pd.DataFrame:
    """One row per run record, `metrics` flattened to its ServeMetrics field names, `gpu` to
    `gpu_<field>` columns, the server's mean decode, prefill and mixed step to
    `engine_<kind>_ms`, plus `cell` ("c=16").

    Numbers a run lacks are NaN; `steps` and `step_ms` stay dicts per row.
    """
    frame = pd.DataFrame([_record_row(r) for r in records], columns=list(RUN_COLUMNS))
    numeric = [*METRIC_FIELDS, "sibling_busy_cpus", *(f"gpu_{name}" for name in _GPU_FIELDS),
               *(f"engine_{kind}_ms" for kind in ENGINE_KINDS)]
    frame[numeric] = frame[numeric].astype(float)
    frame["ok"] = frame["ok"].astype(bool)
    frame["planner_off"] = frame["planner_off"].astype(bool)
    return frame


def _round_medians(frame: pd.DataFrame) -> pd.DataFrame:
    ok = frame[frame["ok"] & frame[THROUGHPUT].notna()]
    return ok.groupby(["concurrency", "arm", "round"], as_index=False)[THROUGHPUT].median()


def paired_deltas(frame: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per cell and round, each non-baseline arm's median tok/s against the baseline's.

    delta = arm / base - 1 (a fraction). Rounds where either side has no ok run are left out.
    Sorted by concurrency, arm, round.
    """
    medians = _round_medians(frame)
    base = medians[medians["arm"] == baseline].drop(columns="arm")
    base = base.rename(columns={THROUGHPUT: "base_tok_s"})
    arms = medians[medians["arm"] != baseline].rename(columns={THROUGHPUT: "arm_tok_s"})
    paired = arms.merge(base, on=["concurrency", "round"], how="inner")
    paired["delta"] = paired["arm_tok_s"] / paired["base_tok_s"] - 1.0
    paired["cell"] = [f"c={c}" for c in paired["concurrency"]]
    paired = paired.sort_values(["concurrency", "arm", "round"], kind="stable")
    return paired[list(PAIRED_COLUMNS)].reset_index(drop=True)


def sign_test_p(deltas: Iterable[float]) -> float:
    """Exact two-sided sign test (binomial, p = 0.5) over the deltas' signs; zeros are dropped.

    p = min(1, 2 * P[X <= min(positives, negatives)]) with X ~ Binomial(n, 1/2); 1.0 for n = 0.
    """
    values = list(deltas)
    pos = sum(1 for d in values if d > 0)
    neg = sum(1 for d in values if d < 0)
    n = pos + neg
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(pos, neg) + 1))
    return min(1.0, 2 * tail / 2**n)


def aa_spread(paired: pd.DataFrame, aa_arm: str | None, cell: str) -> float | None:
    """The largest |paired delta| of the A/A arm in `cell`, or None without A/A rounds there."""
    if aa_arm is None:
        return None
    deltas = paired[(paired["arm"] == aa_arm) & (paired["cell"] == cell)]["delta"]
    return float(deltas.abs().max()) if len(deltas) else None


def decide(deltas: list[float], threshold: float, min_rounds: int = MIN_ROUNDS) -> str:
    """The verdict for one arm and cell from its paired deltas (see RULE)."""
    if len(deltas) < min_rounds:
        return "too few rounds"
    median = float(pd.Series(deltas).median())
    if sign_test_p(deltas) < ALPHA and abs(median) > threshold:
        return "faster" if median > 0 else "slower"
    return "within noise"


def _verdict_row(cell: str, arm: str, deltas: list[float], threshold: float,
                 min_rounds: int) -> dict:
    median = float(pd.Series(deltas).median()) if deltas else math.nan
    return {"cell": cell, "arm": arm, "rounds": len(deltas), "median_delta": median,
            "p_value": sign_test_p(deltas), "threshold": threshold,
            "verdict": decide(deltas, threshold, min_rounds)}


def verdicts(paired: pd.DataFrame, baseline: str, aa_arm: str | None = None,
             min_rounds: int = MIN_ROUNDS, min_effect: float = MIN_EFFECT) -> pd.DataFrame:
    """One verdict row per (cell, arm) present in `paired`, the A/A arm included (see RULE).

    Columns: cell, arm, rounds, median_delta, p_value, threshold, verdict. Arms or cells with no
    paired round have no row here; callers treat them as `too few rounds`.
    """
    rows = []
    for (concurrency, arm), group in paired.groupby(["concurrency", "arm"], sort=True):
        if arm == baseline:
            continue
        cell = f"c={concurrency}"
        spread = aa_spread(paired, aa_arm, cell)
        threshold = max(min_effect, spread) if spread is not None else min_effect
        rows.append(_verdict_row(cell, arm, list(group["delta"]), threshold, min_rounds))
    return pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
