"""The gate's statistics: paired deltas, the exact sign test and the verdict rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gate import stats
from gate.load import ServeMetrics
from gate.records import GpuSample, RunRecord


def _metrics(tok_s: float, concurrency: int = 16) -> ServeMetrics:
    """A run of one second at `tok_s`, its latencies left out."""
    return ServeMetrics(max_concurrency=concurrency, duration=1.0, completed=concurrency,
                        failed=0, total_input_tokens=0, total_output_tokens=int(tok_s),
                        request_throughput=float(concurrency), output_throughput=tok_s)


def _records(arm: str, tok_s: list[float], concurrency: int = 16) -> list[RunRecord]:
    """One ok run per round for `arm`, round i at tok_s[i]."""
    return [RunRecord(round=i, arm=arm, position=0, concurrency=concurrency, run=1, ok=True,
                      metrics=_metrics(value, concurrency))
            for i, value in enumerate(tok_s)]


def _base(rounds: int) -> list[float]:
    return [1000.0 + 37.0 * i for i in range(rounds)]  # rounds differ; pairing removes it


def _verdict(records: list[RunRecord], arm: str, aa_arm: str | None = None) -> dict:
    paired = stats.paired_deltas(stats.runs_frame(records), "main")
    table = stats.verdicts(paired, "main", aa_arm)
    return table[table["arm"] == arm].iloc[0].to_dict()


def test_sign_test_exact_small_n():
    assert stats.sign_test_p([0.05] * 6) == pytest.approx(0.03125)
    assert stats.sign_test_p([-0.05] * 6) == pytest.approx(0.03125)
    assert stats.sign_test_p([0.05] * 5) == pytest.approx(0.0625)
    assert stats.sign_test_p([0.05] * 5 + [0.0, 0.0]) == pytest.approx(0.0625)  # ties dropped
    assert stats.sign_test_p([0.1, 0.1, 0.1, 0.1, 0.1, -0.1]) == pytest.approx(14 / 64)
    assert stats.sign_test_p([0.1, -0.1]) == 1.0
    assert stats.sign_test_p([]) == 1.0
    assert stats.sign_test_p([0.0, 0.0]) == 1.0


def test_consistent_gain_is_faster_and_loss_slower():
    base = _base(6)
    up = _verdict(_records("main", base) + _records("head", [b * 1.05 for b in base]), "head")
    assert up["verdict"] == "faster"
    assert up["rounds"] == 6
    assert up["median_delta"] == pytest.approx(0.05)
    assert up["p_value"] == pytest.approx(0.03125)
    assert up["threshold"] == pytest.approx(0.01)
    down = _verdict(_records("main", base) + _records("head", [b * 0.95 for b in base]), "head")
    assert down["verdict"] == "slower"


@pytest.mark.parametrize("deltas", [
    [0.05, 0.05, 0.05, 0.05, 0.05, -0.05],  # 6 rounds, one against: p = 14/64
    [0.08, 0.06, 0.05, 0.05, 0.04, -0.01, -0.02, -0.03],  # 8 rounds, 3 against: p = 186/256
    [-0.05, -0.05, -0.05, -0.05, -0.05, 0.05],  # the same for a loss
])
def test_an_effect_over_the_threshold_with_mixed_signs_is_within_noise(deltas):
    """The median clears the threshold several times over; only the sign test's p >= 0.05
    keeps the verdict at `within noise`."""
    assert len(deltas) >= stats.MIN_ROUNDS
    assert abs(float(np.median(deltas))) >= 0.04
    assert stats.sign_test_p(deltas) >= stats.ALPHA
    assert stats.decide(deltas, threshold=0.01) == "within noise"
    base = _base(len(deltas))
    row = _verdict(_records("main", base) + _records("head", [b * (1 + d) for b, d in
                                                              zip(base, deltas, strict=True)]),
                   "head")
    assert row["p_value"] >= stats.ALPHA and abs(row["median_delta"]) > row["threshold"]
    assert row["verdict"] == "within noise"


def test_verdict_boundaries():
    # exactly MIN_ROUNDS rounds all of one sign: p = 0.03125 < 0.05, a verdict
    assert stats.decide([0.02] * 6, threshold=0.01) == "faster"
    assert stats.decide([-0.02] * 6, threshold=0.01) == "slower"
    # one round fewer is too few, however clear
    assert stats.decide([0.5] * 5, threshold=0.01) == "too few rounds"
    # all of one sign but the median under, or at, the threshold
    assert stats.decide([0.005] * 6, threshold=0.01) == "within noise"
    assert stats.decide([0.01] * 6, threshold=0.01) == "within noise"
    assert stats.decide([0.02, 0.02, 0.02, 0.005, 0.005, 0.005], threshold=0.01) == "faster"
    assert stats.decide([0.02, 0.02, 0.005, 0.005, 0.005, 0.005],
                        threshold=0.01) == "within noise"  # median 0.005
    base = _base(6)
    small = _verdict(_records("main", base) + _records("head", [b * 1.005 for b in base]),
                     "head")
    assert small["p_value"] == pytest.approx(0.03125) and small["verdict"] == "within noise"


def test_aa_noise_is_within_noise():
    base = _base(8)
    noise = [0.005, -0.004, 0.003, -0.005, 0.002, -0.003, 0.004, -0.002]
    records = _records("main", base) + _records("main2", [b * (1 + n) for b, n in
                                                          zip(base, noise, strict=True)])
    assert _verdict(records, "main2", aa_arm="main2")["verdict"] == "within noise"


def test_two_rounds_is_too_few():
    base = _base(2)
    row = _verdict(_records("main", base) + _records("head", [b * 1.5 for b in base]), "head")
    assert row["verdict"] == "too few rounds"
    assert row["rounds"] == 2


def test_aa_spread_raises_the_threshold():
    base = _base(6)
    aa = [0.06, -0.02, 0.01, -0.03, 0.02, -0.01]  # largest |delta| 6%
    records = (_records("main", base) + _records("head", [b * 1.05 for b in base])
               + _records("aa", [b * (1 + d) for b, d in zip(base, aa, strict=True)]))
    head = _verdict(records, "head", aa_arm="aa")
    assert head["threshold"] == pytest.approx(0.06)
    assert head["verdict"] == "within noise"
    assert _verdict(records, "aa", aa_arm="aa")["verdict"] == "within noise"


def test_paired_deltas_use_round_medians_and_skip_unpaired_rounds():
    def run(round_index, arm, run_no, tok, ok=True):
        return RunRecord(round=round_index, arm=arm, position=0, concurrency=1, run=run_no,
                         ok=ok, metrics=_metrics(tok, 1) if ok else None)

    records = [run(0, "main", 1, 100.0), run(0, "main", 2, 120.0), run(0, "main", 3, 900.0),
               run(0, "head", 1, 121.0), run(0, "head", 2, 0.0, ok=False),
               run(1, "main", 1, 100.0), run(1, "head", 1, 0.0, ok=False),
               run(2, "head", 1, 100.0)]
    paired = stats.paired_deltas(stats.runs_frame(records), "main")
    assert list(paired.columns) == list(stats.PAIRED_COLUMNS)
    assert len(paired) == 1
    row = paired.iloc[0]
    assert (row["cell"], row["arm"], row["round"]) == ("c=1", "head", 0)
    assert row["base_tok_s"] == 120.0
    assert row["delta"] == pytest.approx(121.0 / 120.0 - 1)


def test_runs_frame_flattens_gpu_and_keeps_failed_runs():
    ok = RunRecord(round=0, arm="main", position=0, concurrency=4, run=1, ok=True,
                   metrics=_metrics(10.0, 4), gpu=GpuSample(sm_clock_mhz=1980.0, power_w=300.0))
    failed = RunRecord(round=0, arm="main", position=0, concurrency=4, run=2, ok=False,
                       error="boom")
    frame = stats.runs_frame([ok, failed])
    assert list(frame["ok"]) == [True, False]
    assert frame.loc[0, "gpu_sm_clock_mhz"] == 1980.0
    assert math.isnan(frame.loc[1, "gpu_sm_clock_mhz"])
    assert frame.loc[0, "output_throughput"] == 10.0
    assert math.isnan(frame.loc[1, "output_throughput"])
    assert list(frame["cell"]) == ["c=4", "c=4"]
    assert stats.runs_frame([]).empty


def test_no_baseline_runs_gives_no_verdict_rows():
    paired = stats.paired_deltas(stats.runs_frame(_records("head", _base(6))), "main")
    assert paired.empty
    assert stats.verdicts(paired, "main").empty
