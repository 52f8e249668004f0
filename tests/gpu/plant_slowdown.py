"""Copies this tree's `resident` package to DEST and plants a GPU-side delay in every decode
step: `torch.cuda._sleep(CYCLES)` on the step's stream just before the decode graph launches.
The copy is a gate arm (`planted=path:DEST`) of known cost for proving the verdict rule
(configs/gate/h200-0.8b-planted.yaml, issue 21).

    python3 tests/gpu/plant_slowdown.py /tmp/planted --cycles 80000
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = "        return self.runner.launch_decode(prepared.bucket, prepared.width, draws)\n"


def plant(dest: Path, cycles: int) -> Path:
    if cycles < 1:
        raise ValueError(f"--cycles must be >= 1, got {cycles}")
    if dest.exists():
        shutil.rmtree(dest)
    for part in ("resident", "configs"):  # the model configs live beside the package
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    engine = dest / "resident" / "engine" / "engine.py"
    source = engine.read_text()
    if source.count(LAUNCH) != 1:
        raise SystemExit(f"{engine}: the decode launch line moved; update LAUNCH here")
    engine.write_text(source.replace(
        LAUNCH, f"        torch.cuda._sleep({cycles})  # planted slowdown\n" + LAUNCH))
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--cycles", type=int, default=80_000)
    args = parser.parse_args()
    print(f"planted {args.cycles} cycles a decode step in {plant(args.dest, args.cycles)}")


if __name__ == "__main__":
    main()
