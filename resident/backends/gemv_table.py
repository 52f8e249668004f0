"""A measured table of which kernel runs each decode projection: the knob `gemv_table`.

`python -m resident.tools.bench_gemv --json FILE` times, at each (N, K) projection of a model and
each row count, the skinny Triton GEMV's tiles (both forms) against cuBLAS on the GPU it runs on,
with cold weights. Given that file, a decode bucket of at most 256 rows (gemv.MAX_ROWS) runs each
projection on whichever was faster at the nearest measured row count at or above the bucket's
(in the bucket's row class), so a Triton tile is chosen only where it beat cuBLAS, or where an
entry's "pick" (written by tools/pick_gemv_table for a whole-step A/B) says so; the choices are
logged at start (a bucket of 17-256 rows, which decode_gemm's rule leaves on cuBLAS, moves only
by a table). A narrow projection that runs the next add + norm in its kernel
(fused_decode=full) keeps its best Triton tile even where cuBLAS won alone: cuBLAS would leave
the norm a kernel of its own. Shapes the table lacks, or measured only at fewer rows than a
bucket's, keep decode_gemm's rule. A sweep taken with --pdl timed the Triton tiles as a step
launches them: its entries say so, and so does the start-up log.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from resident.kernels.gdc import KeptZeros
from resident.kernels.gemv import MAX_ROWS, GemvTile, row_class, skinny_linear_add_norm
from resident.model.config import configs_dir

# (n, k, bucket) -> the kernel the engine runs there in place of the table's entry, or None
RunsInstead = Callable[[int, int, int], str | None]

log = logging.getLogger("resident.backends")


# what an entry's "pick" may say (tools/pick_gemv_table): run this kernel whatever the times
PICKS = ("triton", "cublas")


@dataclass(frozen=True)
class GemvChoice:
    """What bench_gemv measured at one (N, K, rows): its best Triton tile and both times, and
    the kernel a whole-step A/B picked over those times, if one did (`pick`). pdl: the Triton
    time was taken in a PDL chain (bench_gemv --pdl), as a step launches the tile."""

    rows: int
    tile: GemvTile
    triton_us: float
    cublas_us: float
    pick: str = ""
    pdl: bool = False

    @property
    def triton(self) -> bool:
        """Whether the Triton tile runs: the pick, else the faster alone. Alone is not in a
        step: there the Triton GEMV launches under PDL, its weight read overlapping the
        kernel before it, and on an H100 the 24-128-row steps were 2-4% shorter with every
        projection on it, cuBLAS's alone-wins included (results/2026-12-07-h100-pdl-chain)."""
        if self.pick:
            return self.pick == "triton"
        return self.triton_us < self.cublas_us


class GemvTable:
    """The choices of one bench_gemv file, by (N, K), each shape's sorted by rows."""

    def __init__(self, choices: dict[tuple[int, int], list[GemvChoice]], source: str) -> None:
        self.source = source
        self._choices = {shape: sorted(found, key=lambda c: c.rows)
                         for shape, found in choices.items()}

    @classmethod
    def load(cls, path: str) -> GemvTable:
        """Reads bench_gemv's --json rows; a file that is not one fails naming the knob."""
        try:
            rows = json.loads(Path(path).read_text())
            choices: dict[tuple[int, int], list[GemvChoice]] = {}
            tile_fields = {f.name for f in fields(GemvTile)}
            for row in rows:
                tile = GemvTile(**{k: v for k, v in row["tile"].items() if k in tile_fields})
                pick = row.get("pick", "")
                if pick and pick not in PICKS:
                    raise ValueError(f"pick must be one of {', '.join(PICKS)}, got {pick!r}")
                choices.setdefault((int(row["n"]), int(row["k"])), []).append(GemvChoice(
                    int(row["rows"]), tile, float(row["triton_us"]), float(row["cublas_us"]),
                    pick, bool(row.get("pdl", False))))
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise ValueError(f"knob gemv_table: {path!r} is not a bench_gemv --json file "
                             f"({type(error).__name__}: {error})") from None
        if not choices:
            raise ValueError(f"knob gemv_table: {path!r} holds no measured shape")
        return cls(choices, path)

    def choose(self, n: int, k: int, rows: int) -> GemvChoice | None:
        """The measurement for a bucket of `rows` rows: at the smallest measured row count at
        or above it; None for a shape the table lacks or measured only at fewer rows (a tile
        timed at 4 rows says nothing of 16, and the CUDA-core form stops at 4), and where
        that count is of another row class (gemv.ROW_CLASSES: a bucket of 24 rows never runs
        a tile timed at 128, nor one of 16 the wgmma tiles timed at 64)."""
        found = self._choices.get((n, k), [])
        at = bisect.bisect_left([choice.rows for choice in found], rows)
        if at == len(found) or row_class(found[at].rows) != row_class(rows):
            return None
        return found[at]

    def describe(self, buckets: tuple[int, ...],
                 runs_instead: RunsInstead | None = None) -> list[str]:
        """One line a shape: the kernel each bucket runs and what it measured, or what
        runs_instead names there (DecodeFusion.table_note: the gate_up epilogue)."""
        lines = []
        for n, k in self._choices:
            picks = []
            for bucket in buckets:
                instead = runs_instead and runs_instead(n, k, bucket)
                if instead:
                    picks.append(f"{bucket}: {instead} (not the table's entry)")
                    continue
                choice = self.choose(n, k, bucket)
                if choice is None:
                    picks.append(f"{bucket}: decode_gemm's rule (not measured)")
                    continue
                kernel = choice.tile.name if choice.triton else "cuBLAS"
                chain = " in a PDL chain" if choice.pdl else ""
                picked = ", picked in a step" if choice.pick else ""
                picks.append(f"{bucket}: {kernel} ({choice.triton_us:.2f} us{chain}, cuBLAS "
                             f"{choice.cublas_us:.2f} at {choice.rows} rows{picked})")
            lines.append(f"{n}x{k}: " + "; ".join(picks))
        return lines


def table_linear(x: torch.Tensor, weight: torch.Tensor, *, table: GemvTable, fallback,
                 triton_linear, pdl: bool = False) -> torch.Tensor:
    """ModelOps.narrow_linear or wide_linear by the table: the winner, `triton_linear` (the
    split-K partials for a narrow one, a finished [M, N] for a wide one) on its tile or
    cuBLAS; `fallback` for a shape it lacks."""
    choice = table.choose(*weight.shape, x.shape[0])
    if choice is None:
        return fallback(x, weight)
    if not choice.triton:
        return F.linear(x, weight)
    return triton_linear(x, weight, choice.tile, pdl=pdl)


def table_linear_add_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                          norm_weight: torch.Tensor, eps: float, *, table: GemvTable,
                          fallback, scratch: KeptZeros,
                          pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """ModelOps.narrow_linear_add_norm on the table's best Triton tile for the shape, cuBLAS's
    win or not (the norm would otherwise need its own kernel); `fallback` for a shape it
    lacks."""
    choice = table.choose(*weight.shape, x.shape[0])
    if choice is None:
        return fallback(x, weight, residual, norm_weight, eps)
    return skinny_linear_add_norm(x, weight, residual, norm_weight, eps, scratch, choice.tile,
                                  pdl=pdl)


def shipped_table_path(device_name: str) -> Path:
    """Where `gemv_table=auto` looks for a GPU's table: configs/gemv/<its name, spaces and
    slashes as underscores>.json, one file holding every model's shapes measured there."""
    return configs_dir() / "gemv" / (re.sub(r"[^\w.-]+", "_", device_name.strip()) + ".json")


def log_table(table: GemvTable, buckets: tuple[int, ...],
              runs_instead: RunsInstead | None = None) -> None:
    read = tuple(bucket for bucket in buckets if bucket <= MAX_ROWS)
    log.info("gemv_table %s: the decode projections' kernels by bucket", table.source)
    for line in table.describe(read, runs_instead):
        log.info("  %s", line)
