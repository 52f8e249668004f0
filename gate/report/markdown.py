"""Markdown and number formatting shared by the gate's reports (summary.py, rounds.py,
paired.py, phases.py, ...)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gate.manifest import Manifest
from gate.verdict import stats

# ---- order and labels ----

def label(arm: str, flagged: set[str]) -> str:
    return arm + stats.PLANNER_OFF if arm in flagged else arm


def cell_arms(frame: pd.DataFrame, manifest: Manifest, cell: str) -> list[str]:
    present = set(frame.loc[frame["cell"] == cell, "arm"])
    return [arm for arm in stats.arm_order(frame, manifest) if arm in present]


# ---- numbers ----

def num(value: Any, digits: int) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return round(float(value), digits)


def median(series: pd.Series) -> float:
    values = series.dropna()
    return float(values.median()) if len(values) else math.nan


def tok_digits(values: list[float | None]) -> int:
    """Whole tok/s once every value is >= 100 (a tenth is noise there), else one decimal."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    return 0 if present and min(present) >= 100 else 1


def fmt_tok(value: float | None, digits: int) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def fmt(value: float | None, digits: int, missing: str = "-") -> str:
    if value is None or math.isnan(value):
        return missing
    return f"{value:.{digits}f}"


def fmt_pct(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value * 100:+.1f}%"


def fmt_slashed(*values: float | None, missing: str = "-") -> str:
    """"a/b/..." to 2 decimals (ITL p50/mean, server step decode/prefill/mixed); `missing`
    when none is known."""
    if all(value is None or math.isnan(value) for value in values):
        return missing
    return "/".join(fmt(value, 2) for value in values)


def round_label(round_index: int) -> str:
    """A round's name in the tables: r1 for the first (round 0 in runs.jsonl)."""
    return f"r{int(round_index) + 1}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# ---- markdown ----

@dataclass(frozen=True)
class TableSpec:
    """One report table, as markdown and the stdout (rich) table both render it. `align` has
    one letter a column: l (left) or r (right)."""

    title: str
    header: list[str]
    rows: list[list[str]]
    align: str

    def __post_init__(self) -> None:
        if len(self.align) != len(self.header) or set(self.align) - {"l", "r"}:
            raise ValueError(f"align {self.align!r}: one l or r for each of "
                             f"{len(self.header)} columns")
        for row in self.rows:
            if len(row) != len(self.header):
                raise ValueError(f"row {row} has {len(row)} cells for {len(self.header)} "
                                 "columns")

    def md(self) -> str:
        return f"## {self.title}\n\n" + md_table(self.header, self.rows, self.align)


def md_table(header: list[str], rows: list[list[str]], align: str) -> str:
    """A pipe table; `align` has one letter a column, l (left) or r (right)."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = ["---:" if a == "r" else "---" for a in align]
    return "\n".join([line(header), "|" + "|".join(rule) + "|", *(line(r) for r in rows)])


def known(value: Any) -> str:
    """A manifest value as the reports print it: `?` where the session did not record it."""
    return "?" if value is None else str(value)


def header_line(manifest: Manifest) -> str:
    """Model, device, prompt/output lengths, cells and rounds x runs, as one line."""
    cells = ", ".join(f"c={c}" for c in manifest.cells) or "-"
    rounds = f"{known(manifest.rounds)} rounds"
    if manifest.until_verdict:
        rounds = (f"until every cell had a verdict: {known(manifest.rounds_run)} of at "
                  f"most {known(manifest.max_rounds)} rounds")
    # absolute numbers depend on the mode: on the H200 a 0.8B decode step's graph ran 4%
    # faster with a second server up (results/2026-12-03-h200-c1-modes); paired verdicts do not
    servers = ("; interleaved: each round's servers up together, runs alternating between arms"
               if manifest.interleave else "; sequential: one server up at a time")
    return (f"Model {known(manifest.model)} on {known(manifest.device)}; "
            f"prompt {known(manifest.prompt_len)} tokens"
            + (f" after one shared {manifest.shared_prefix_len}-token prefix"
               if manifest.shared_prefix_len else "") + ", "
            f"output {known(manifest.output_len)} tokens, {sampling_text(manifest.sampling)}; "
            f"cells {cells}{arrivals_text(manifest.request_rate)}; "
            f"{rounds} x {known(manifest.runs)} runs{servers}.")


def arrivals_text(rates: dict[str, float] | None) -> str:
    """Nothing for a closed loop; the open loop's rate a cell otherwise."""
    if not rates:
        return ""
    return (" (open loop, Poisson arrivals: "
            + ", ".join(f"{cell} at {rate:g} requests/s" for cell, rate in rates.items()) + ")")


def sampling_text(sampling: dict | None) -> str:
    """`greedy`, or the workload's temperature and the filters it set."""
    if not sampling or not sampling.get("temperature"):
        return "greedy"
    parts = [f"temperature {sampling['temperature']}"]
    if sampling.get("top_p", 1) < 1:
        parts.append(f"top_p {sampling['top_p']}")
    if sampling.get("top_k"):
        parts.append(f"top_k {sampling['top_k']}")
    return " ".join(parts)


def arms_line(manifest: Manifest) -> str:
    aa = manifest.aa_arm
    aa_text = f"A/A arm {aa} (a second copy of the baseline)" if aa else "no A/A arm"
    return f"Baseline {known(manifest.baseline)}; {aa_text}."


def page_title(manifest: Manifest, what: str) -> str:
    return f"# {manifest.name or 'gate session'}: {what}"
