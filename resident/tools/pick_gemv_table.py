"""A gemv table's entries at some row counts picked to one kernel, whatever their times alone.

    python -m resident.tools.pick_gemv_table TABLE.json --rows 32,64,128 [--kernel triton]
        [--shapes "gdn out_proj,attn qkv"] --out FILE [--format table|json]

TABLE.json is `bench_gemv --json` (or a committed configs/gemv file). bench_gemv times each
projection alone; in a decode step the Triton GEMV launches under PDL and its weight read
overlaps the kernel before it, which cuBLAS's kernels do not, so a Triton tile that lost alone
can still shorten the step (on an H100, every projection of the 0.8B's 24-128-row buckets:
results/2026-12-07-h100-pdl-chain). This writes the entries at --rows (of --shapes, by their
bench_gemv names, or all) with `"pick": "<kernel>"`, which the engine's table follows over the
times (backends/gemv_table.py); the times stay as measured. Run `resident.tools.bench` with
gemv_table=FILE against the table without the picks, and keep the row counts the steps
confirm with `resident.tools.confirm_gemv_table FILE --rule BASE.json --table PICKED.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from resident.backends.gemv_table import PICKS
from resident.render import OutputFormat, render
from resident.tool_args import add_format, counts


def pick(entries: list[dict], rows: list[int], kernel: str,
         shapes: list[str] | None = None) -> list[dict]:
    """The entries with `pick` set to `kernel` (one of PICKS) at `rows` (and `shapes`, if
    given); a shape named that no entry has fails naming it."""
    missing = sorted(set(shapes or ()) - {entry["shape"] for entry in entries})
    if missing:
        raise ValueError(f"no entry of shape {', '.join(map(repr, missing))}")
    picked = []
    for entry in entries:
        if int(entry["rows"]) in rows and (not shapes or entry["shape"] in shapes):
            entry = {**entry, "pick": kernel}
        picked.append(entry)
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="bench_gemv --json file or a configs/gemv table")
    parser.add_argument("--rows", type=counts, required=True,
                        help="the row counts whose entries are picked")
    parser.add_argument("--kernel", choices=PICKS, default="triton")
    parser.add_argument("--shapes", help="comma-separated bench_gemv shape names (all if unset)")
    parser.add_argument("--out", required=True, help="write the picked table here")
    add_format(parser)
    args = parser.parse_args(argv)
    try:
        entries = json.loads(Path(args.table).read_text())
        shapes = args.shapes.split(",") if args.shapes else None
        picked = pick(entries, args.rows, args.kernel, shapes)
    except (OSError, ValueError, TypeError, KeyError) as error:
        parser.error(f"{args.table}: {error}")
    Path(args.out).write_text(json.dumps(picked, indent=1) + "\n")
    render({"picked entries": [
        {"shape": entry["shape"], "rows": entry["rows"], "pick": entry["pick"],
         "triton_us": entry["triton_us"], "cublas_us": entry["cublas_us"]}
        for entry in picked if entry.get("pick")]}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
