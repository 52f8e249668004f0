"""The table in README.md, from the sessions kept here (or in the sessions directory given, as
results/2026-12-02-cpu-demo-rounds does): each session's design, wall time, and head's
per-round deltas and verdict in each cell, judged by the tree's gate code.

    python results/2026-12-02-cpu-demo-interleave/table.py [SESSIONS]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gate import stats
from gate.records import read_manifest, read_runs

HERE = Path(__file__).resolve().parent


def placement(cpus: dict) -> str:
    if len(cpus["server_cpus"]) == 1:
        return "all on one CPU"
    if cpus["step_cores"]:
        return f"step threads on {cpus['step_cores']}, API and client on {cpus['client_cpus']}"
    return "unpinned"


def design(manifest: dict) -> str:
    requests = ",".join(str(n) for n in manifest["requests"].values())
    mode = "interleaved" if manifest.get("interleave") else "one server after another"
    if manifest.get("parallel_start"):
        mode += " (parallel start)"
    cpus = placement(manifest["placement"])
    arms = "+".join(arm["name"] for arm in manifest["arms"])
    return (f"{mode}, {cpus}, {arms}, p{manifest['prompt_len']}/o{manifest['output_len']}, "
            f"{manifest['rounds']}x{manifest['runs']} runs of {requests}")


def row(directory: Path) -> str:
    manifest = read_manifest(directory)
    frame = stats.runs_frame(read_runs(directory))
    slots = stats.by_slot(manifest)
    paired = stats.paired_deltas(frame, "main", slots)
    table = stats.verdicts(frame, "main", None, stats.design_of(manifest), slots)
    cells = []
    for concurrency in manifest["cells"]:
        mine = paired[(paired["arm"] == "head") & (paired["concurrency"] == concurrency)]
        verdict = table[(table["arm"] == "head") & (table["cell"] == f"c={concurrency}")]
        deltas = " ".join(f"{d * 100:+.0f}" for d in mine["delta"])
        cells.append(f"{deltas} **{verdict.iloc[0]['verdict']}**")
    wall = round(manifest["timing"]["wall_s"])
    return (f"| {directory.name} | {design(manifest)} | {wall // 60}m{wall % 60:02d}s | "
            + " | ".join(cells) + " |")


def main(sessions: Path) -> None:
    print("| session | design | wall | head c=1: deltas %, verdict | head c=4 |")
    print("|---|---|---:|---|---|")
    order = json.loads((sessions / "order.json").read_text())
    for name in order:
        print(row(sessions / name))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "sessions")
