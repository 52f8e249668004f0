"""A gemv table cut to the row counts a whole decode step confirmed.

    python -m resident.tools.confirm_gemv_table SWEEP.json --rule BENCH.json --table BENCH.json
        [--min-gain 0.01] [--out FILE] [--format table|json]

SWEEP.json is `bench_gemv --json`: each projection's fastest kernel, timed alone with cold
weights (or the Triton tiles in a PDL chain, --pdl). Neither is a step: on an H100 a table of
the CUDA-core tiles alone made the 4-row step slower (1.246 -> 1.351 ms,
results/2026-12-05-h100-core-spy) while its sweep said faster, and at 128 rows the chain gives
cuBLAS three projections that a step A/B gave the Triton GEMV (results/2026-12-07-h100-gemv-chain).
So the two BENCH files are `resident.tools.bench --json` runs of one tree at concurrencies equal
to the sweep's row counts: `--rule` with `gemv_table=off`, `--table` with `gemv_table=SWEEP.json`.

A bucket of r rows reads the sweep's entries at the smallest measured row count >= r
(backends/gemv_table.py). The kept row counts are therefore a prefix: from the smallest up,
each kept while the table's step at that concurrency is at least `--min-gain` shorter than the
rule's; the first that is not (or that no bench ran) ends it, so every bucket the kept table
reaches reads entries its own step confirmed, and the rest keep decode_gemm's rule. A bucket
never reads an entry of another row class (gemv.ROW_CLASSES: 1-16, 17-64, 65-128, 129-256
rows), so each class's row counts are a prefix of their own. The kept entries are written to
--out, for `configs/gemv/<GPU name>.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from resident.kernels.gemv import row_class
from resident.render import OutputFormat, render
from resident.tool_args import add_format

# two calls of the bench read a step within ~0.3% (results/2026-12-05-h100-gemv-table)
MIN_GAIN = 0.01


def step_ms_by_concurrency(bench: dict) -> dict[int, float]:
    """A bench --json file's decode step wall time by concurrency."""
    return {int(row["concurrency"]): float(row["step_ms"]) for row in bench["rows"]}


def confirm(sweep: list[dict], rule: dict[int, float], table: dict[int, float],
            min_gain: float = MIN_GAIN) -> tuple[list[dict], list[dict]]:
    """(the sweep's entries at the confirmed row counts, one verdict row a measured row
    count)."""
    kept_rows: list[int] = []
    verdicts = []
    broken: dict[int, bool] = {}  # each row class's prefix
    for rows in sorted({int(entry["rows"]) for entry in sweep}):
        row_cls = row_class(rows)
        rule_ms, table_ms = rule.get(rows), table.get(rows)
        gain = None if rule_ms is None or table_ms is None else 1 - table_ms / rule_ms
        if broken.get(row_cls):
            why = "a smaller row count was not confirmed"
        elif gain is None:
            why = f"no bench at concurrency {rows}"
        elif gain < min_gain:
            why = f"gain under {min_gain:.1%}"
        else:
            why = "kept"
            kept_rows.append(rows)
        broken[row_cls] = why != "kept"
        verdicts.append({"rows": rows, "rule_ms": rule_ms, "table_ms": table_ms,
                         "gain": None if gain is None else round(gain, 4), "verdict": why})
    return [entry for entry in sweep if int(entry["rows"]) in kept_rows], verdicts


def _read(path: str, what: str):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"{what} {path!r}: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="bench_gemv --json file")
    parser.add_argument("--rule", required=True, help="bench --json file, gemv_table=off")
    parser.add_argument("--table", required=True,
                        help="bench --json file, gemv_table=the sweep's file")
    parser.add_argument("--min-gain", type=float, default=MIN_GAIN,
                        help="the step's fraction the table must save at a row count")
    parser.add_argument("--out", help="write the confirmed entries here")
    add_format(parser)
    args = parser.parse_args(argv)
    if not 0 <= args.min_gain < 1:
        parser.error(f"--min-gain must be a fraction in [0, 1), got {args.min_gain}")
    sweep = _read(args.sweep, "sweep")
    try:
        rule = step_ms_by_concurrency(_read(args.rule, "--rule"))
        table = step_ms_by_concurrency(_read(args.table, "--table"))
    except (KeyError, TypeError, ValueError) as error:
        raise SystemExit(f"--rule / --table: not a bench --json file ({error!r})") from None
    kept, verdicts = confirm(sweep, rule, table, args.min_gain)
    if args.out:
        Path(args.out).write_text(json.dumps(kept, indent=1) + "\n")
    render({"gemv table by row count": verdicts}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
