"""The gate's plots: tok/s and ITL per cell per arm, over the ok runs of all rounds.

Figures are built on matplotlib's Agg canvas directly (no pyplot), so nothing global changes:
no backend switch, no rc edits, no figure registry to leak from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gate.manifest import Manifest
from gate.verdict import stats

TOK_S_FILE = "tok_s.png"
ITL_FILE = "itl.png"
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
_PANEL_WIDTH_IN = 3.2


def _figure(panels: int, title: str) -> tuple[Figure, list]:
    fig = Figure(figsize=(max(6.5, _PANEL_WIDTH_IN * panels), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(panels, 1), squeeze=False)[0]
    fig.suptitle(title)
    return fig, list(axes)


def _empty(path: Path, title: str) -> None:
    fig, (ax,) = _figure(1, title)
    ax.text(0.5, 0.5, "no ok run to plot", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    fig.savefig(path, dpi=110)


def _ok_runs(frame: pd.DataFrame, cell: str, arm: str) -> pd.DataFrame:
    return frame[(frame["cell"] == cell) & (frame["arm"] == arm) & frame["ok"]]


def _plotted_cells(frame: pd.DataFrame, manifest: Manifest) -> list[str]:
    ok_cells = set(frame.loc[frame["ok"] & frame[stats.THROUGHPUT].notna(), "cell"])
    return [cell for cell in stats.cell_order(frame, manifest) if cell in ok_cells]


def _labels(frame: pd.DataFrame, manifest: Manifest) -> dict[str, str]:
    flagged = stats.planner_off_arms(frame, manifest)
    return {arm: arm + stats.PLANNER_OFF if arm in flagged else arm
            for arm in stats.arm_order(frame, manifest)}


def _panels(frame: pd.DataFrame, manifest: Manifest, path: Path,
            title: str) -> tuple[Figure, list[tuple[Any, str]]] | None:
    """A figure with one panel per plotted cell, as (axis, cell) pairs; with no ok run to plot,
    writes the empty figure and returns None."""
    cells = _plotted_cells(frame, manifest)
    if not cells:
        _empty(path, title)
        return None
    fig, axes = _figure(len(cells), title)
    return fig, list(zip(axes, cells, strict=True))


def _median_bar(ax, x: float, values: pd.Series, **style: Any) -> None:
    """A median marker at x with a min-max bar; nothing for no values."""
    if values.empty:
        return
    median = float(values.median())
    low, high = median - float(values.min()), float(values.max()) - median
    ax.errorbar([x], [median], yerr=[[low], [high]], **style)


def plot_tok_s(frame: pd.DataFrame, manifest: Manifest, path: Path) -> None:
    """Output tok/s per cell (one panel each) per arm: median marker, min-max error bar."""
    panels = _panels(frame, manifest, path,
                     "Output tok/s per arm: median over ok runs, bars min-max")
    if panels is None:
        return
    fig, cells = panels
    labels = _labels(frame, manifest)
    for ax, cell in cells:
        for i, arm in enumerate(stats.arm_order(frame, manifest)):
            _median_bar(ax, i, _ok_runs(frame, cell, arm)[stats.THROUGHPUT].dropna(), fmt="o",
                        capsize=5, markersize=7, color=_COLORS[i % len(_COLORS)],
                        label=labels[arm])
        _arm_axis(ax, frame, manifest, cell)
        ax.set_ylabel("output tok/s")
    _legend(fig, [ax for ax, _ in cells])
    fig.savefig(path, dpi=110)


def plot_itl(frame: pd.DataFrame, manifest: Manifest, path: Path) -> None:
    """ITL p50 and mean per cell (one panel each) per arm: median over ok runs, min-max bars."""
    panels = _panels(frame, manifest, path,
                     "Inter-token latency per arm: median over ok runs, bars min-max")
    if panels is None:
        return
    fig, cells = panels
    for ax, cell in cells:
        for i, arm in enumerate(stats.arm_order(frame, manifest)):
            runs = _ok_runs(frame, cell, arm)
            for offset, column, marker, name in ((-0.12, "median_itl_ms", "o", "ITL p50"),
                                                 (0.12, "mean_itl_ms", "s", "ITL mean")):
                _median_bar(ax, i + offset, runs[column].dropna(), fmt=marker, capsize=4,
                            markersize=6, color=_COLORS[i % len(_COLORS)],
                            markerfacecolor="white" if marker == "s" else None, label=name)
        _arm_axis(ax, frame, manifest, cell)
        ax.set_ylabel("ITL (ms)")
    _itl_legend(fig)
    fig.savefig(path, dpi=110)


def _arm_axis(ax, frame: pd.DataFrame, manifest: Manifest, cell: str) -> None:
    arms = stats.arm_order(frame, manifest)
    labels = _labels(frame, manifest)
    ax.set_xticks(range(len(arms)), [labels[a] for a in arms], rotation=20, ha="right")
    ax.set_xlim(-0.6, len(arms) - 0.4)
    ax.set_title(f"concurrency {cell.removeprefix('c=')}")
    ax.set_xlabel("arm")
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.15)


def _legend(fig: Figure, axes: list) -> None:
    handles, names = {}, []
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            if name not in handles:
                handles[name] = handle
                names.append(name)
    fig.legend([handles[n] for n in names], names, loc="outside lower center",
               ncols=min(len(names), 4), title="arm")


def _itl_legend(fig: Figure) -> None:
    handles = [Line2D([], [], marker="o", linestyle="", color="black", label="ITL p50"),
               Line2D([], [], marker="s", linestyle="", color="black", markerfacecolor="white",
                      label="ITL mean")]
    fig.legend(handles=handles, loc="outside lower center", ncols=2,
               title="marker (colour: arm, as on the x axis)")
