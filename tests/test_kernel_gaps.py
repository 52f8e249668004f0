"""resident.tools.kernel_gaps on the hand-built profile window (tests/profile_fixtures.py)."""

from __future__ import annotations

import gzip
import json

from resident.profiling.torch_trace import from_chrome_trace
from resident.tools import kernel_gaps
from tests.profile_fixtures import chrome_trace


def test_gaps_between_a_replays_kernels_per_pair():
    gaps, span = kernel_gaps.replay_gaps(from_chrome_trace(chrome_trace()), "decode")
    assert gaps == {"gemm -> attn": 20.0, "attn -> norm": 10.0}
    assert span == 200.0


def test_compare_names_the_pairs_that_changed_largest_first():
    rows, spans = kernel_gaps.compare(from_chrome_trace(chrome_trace()),
                                      from_chrome_trace(chrome_trace(head=True)), "decode")
    # head: gemm ends at 200, gather 201-205, attn 220-280, norm 280-300
    assert rows[0] == ("gemm -> attn", 20.0, 0.0)
    assert dict((name, (base, head)) for name, base, head in rows) == {
        "gemm -> attn": (20.0, 0.0), "gather -> attn": (0.0, 15.0), "attn -> norm": (10.0, 0.0),
        "gemm -> gather": (0.0, 1.0)}
    assert spans == (200.0, 200.0)


def test_main_reads_gzipped_traces_and_refuses_a_kind_without_replays(tmp_path, capsys):
    paths = []
    for head in (False, True):
        path = tmp_path / f"{'head' if head else 'base'}.json.gz"
        with gzip.open(path, "wt") as file:
            json.dump(chrome_trace(head=head), file)
        paths.append(str(path))
    assert kernel_gaps.main(paths) == 0
    assert "-20.0  gemm -> attn" in capsys.readouterr().out
    assert kernel_gaps.main([*paths, "--kind", "mixed"]) == 1
    assert "no graph replays of mixed steps" in capsys.readouterr().err


def test_no_steps_of_a_kind_give_no_span():
    assert kernel_gaps.replay_gaps(from_chrome_trace(chrome_trace()), "prefill") == ({}, None)
