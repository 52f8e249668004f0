"""resident.tools.kernel_gaps on the hand-built profile window (tests/profile_fixtures.py)."""

from __future__ import annotations

import gzip
import json

from resident.profiling.timeline import Timeline
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
    printed = capsys.readouterr().out
    assert "-20.0  gemm -> attn" in printed
    assert "idle between launches µs a step: base 0.0, head 0.0" in printed
    assert kernel_gaps.main(paths[:1]) == 0
    alone = capsys.readouterr().out.splitlines()
    assert alone[1:3] == ["gaps µs a step: 30.0", "idle between launches µs a step: 0.0"]
    assert [line.split(None, 1) for line in alone[-2:]] == [["20.0", "gemm -> attn"],
                                                          ["10.0", "attn -> norm"]]
    assert kernel_gaps.main([*paths, "--kind", "mixed"]) == 1
    assert "no graph replays of mixed steps" in capsys.readouterr().err


def test_idle_between_a_steps_launches():
    """The third decode step's graph ends at 2300, its eager kernel runs 2350-2380 and its copy
    2400-2405: 70 µs idle between launches, the other two steps none (median 0); the mixed
    step's one launch has nothing between."""
    timeline = from_chrome_trace(chrome_trace())
    assert kernel_gaps.launch_gaps(timeline, "decode") == 0.0
    assert kernel_gaps.launch_gaps(timeline, "mixed") == 0.0
    assert kernel_gaps.launch_gaps(timeline, "prefill") is None
    third = Timeline(timeline.tool, timeline.activity, timeline.steps,
                     tuple(op for op in timeline.ops if op.step == 2))
    assert kernel_gaps.launch_gaps(third, "decode") == 70.0


def test_no_steps_of_a_kind_give_no_span():
    assert kernel_gaps.replay_gaps(from_chrome_trace(chrome_trace()), "prefill") == ({}, None)
