"""The row check against a planner that builds wrong rows: its expected values come from the
pools, not from the planner's row builder, so it finds what the planner got wrong."""

from __future__ import annotations

import torch

from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.model.config import load_model_config

from model_driver import run_engine

TINY = load_model_config("tiny")


def _engine():
    config = EngineConfig(dtype="float64", row_check="on", decode_buckets=(1, 2, 4))
    return build_engine(TINY, config, "cpu")


def _requests() -> dict[str, tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(1)
    return {f"r{i}": (torch.randint(0, TINY.vocab_size, (5 + 7 * i,),
                                    generator=generator).tolist(), 6) for i in range(3)}


def test_a_sound_planner_passes_every_row():
    engine = _engine()
    run_engine(engine, _requests())
    counts = engine.rowcheck_counts()
    assert counts["enabled"] and counts["steps"] > 0 and counts["rows"] >= counts["steps"]
    assert counts["mismatches"] == 0


def test_a_wrong_position_offset_in_the_planners_rows_is_found():
    engine = _engine()
    stager = engine.planning.planner.stager
    build_row = stager.host_row

    def off_by_one(rid: str):
        row, num_pages = build_row(rid)
        row[stager.layout.offset_col] += 1
        return row, num_pages

    stager.host_row = off_by_one  # every whole row the planner writes
    run_engine(engine, _requests())
    # each whole row's first step reads a wrong offset cell and gathers a wrong position; the
    # next step's flush finds the cell differs from the host streams and stages the right one
    whole = engine.planning.planner.counters["rows_written_whole"]
    assert engine.rowcheck_counts()["mismatches"] == 2 * whole > 0
