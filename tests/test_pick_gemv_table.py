"""resident.tools.pick_gemv_table: a table's entries picked to one kernel at some row counts,
which the engine's gemv table follows over the times measured alone."""

from __future__ import annotations

import json

import pytest

from resident.backends.gemv_table import GemvTable
from resident.tools.pick_gemv_table import main

TILE = {"block_n": 32, "block_k": 64, "num_warps": 4, "num_stages": 4, "target_programs": 0,
        "unroll": 1, "fma": False, "block_m": 64}


def _table(path, entries: list[tuple[str, int, float, float]]) -> str:
    """(shape, rows, triton_us, cublas_us) a bench_gemv entry, each its own (N, K)."""
    shapes = sorted({shape for shape, *_ in entries})
    path.write_text(json.dumps([
        {"shape": shape, "n": 64 * (1 + shapes.index(shape)), "k": 64, "rows": rows,
         "tile": TILE, "best_tile": "t", "triton_us": triton_us, "cublas_us": cublas_us}
        for shape, rows, triton_us, cublas_us in entries]))
    return str(path)


def test_picked_entries_run_their_kernel_whatever_their_times(tmp_path, capsys):
    source = _table(tmp_path / "sweep.json", [
        ("out_proj", 32, 6.1, 5.7), ("out_proj", 128, 7.6, 5.9), ("in_proj", 32, 8.0, 8.2),
        ("in_proj", 128, 9.5, 8.9)])
    out = tmp_path / "picked.json"
    assert main([source, "--rows", "32", "--shapes", "out_proj", "--out", str(out),
                 "--format", "json"]) == 0
    assert [(e["shape"], e["rows"]) for e in json.loads(capsys.readouterr().out)[
        "picked entries"]] == [("out_proj", 32)]
    table = GemvTable.load(str(out))
    # in_proj [64, 64] won alone at 32 rows; out_proj [128, 64] lost and is picked there
    assert table.choose(64, 64, 24).triton and table.choose(128, 64, 24).triton
    assert not table.choose(128, 64, 96).triton and not table.choose(64, 64, 96).triton
    assert table.choose(128, 64, 24).cublas_us == 5.7  # the times stay as measured
    lines = dict(line.split(": ", 1) for line in table.describe((24,)))
    assert "picked in a step" in lines["128x64"] and "picked" not in lines["64x64"]

    main([source, "--rows", "32,128", "--kernel", "cublas", "--out", str(out)])
    table = GemvTable.load(str(out))
    assert not any(table.choose(n, 64, rows).triton for n in (64, 128) for rows in (24, 96))


@pytest.mark.parametrize("args, message", [
    (["--rows", "32", "--shapes", "down"], "no entry of shape 'down'"),
    (["--rows", "32", "--kernel", "fma"], "argument --kernel: invalid choice"),
    (["--rows", "0"], "argument --rows: expected positive integers"),
])
def test_bad_arguments_fail_naming_the_value(tmp_path, capsys, args, message):
    source = _table(tmp_path / "sweep.json", [("out_proj", 32, 6.1, 5.7)])
    with pytest.raises(SystemExit) as refused:
        main([source, *args, "--out", str(tmp_path / "out.json")])
    assert refused.value.code == 2 and message in capsys.readouterr().err


def test_a_table_with_an_unknown_pick_fails_naming_the_knob(tmp_path):
    path = tmp_path / "t.json"
    _table(path, [("out_proj", 32, 6.1, 5.7)])
    path.write_text(path.read_text().replace('"rows": 32', '"rows": 32, "pick": "fast"'))
    with pytest.raises(ValueError, match="knob gemv_table: .*pick must be one of triton, "
                                         "cublas, got 'fast'"):
        GemvTable.load(str(path))
