"""The gate's statistics: paired deltas, Student's t and the exact sign test, and the verdict
rule on golden rounds (the simulation study is tests/test_gate_calibration.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from gate.manifest import Manifest
from gate.metrics import ServeMetrics
from gate.records import GpuSample, RunRecord
from gate.verdict import rule, stats


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


def _verdict(records: list[RunRecord], arm: str, aa_arm: str | None = None,
             design: rule.Design = rule.FIXED) -> dict:
    table = stats.verdicts(stats.runs_frame(records), "main", aa_arm, design)
    return table[table["arm"] == arm].iloc[0].to_dict()


def _session(deltas: dict[str, list[float]], concurrency: int = 16) -> list[RunRecord]:
    """main's rounds at _base, and each arm's at main's times (1 + its delta that round)."""
    base = _base(len(next(iter(deltas.values()))))
    records = _records("main", base, concurrency)
    for arm, values in deltas.items():
        records += _records(arm, [b * (1 + d) for b, d in zip(base, values, strict=True)],
                            concurrency)
    return records


def test_sign_test_exact_small_n():
    assert stats.sign_test_p([0.05] * 6) == pytest.approx(0.03125)
    assert stats.sign_test_p([-0.05] * 6) == pytest.approx(0.03125)
    assert stats.sign_test_p([0.05] * 5) == pytest.approx(0.0625)
    assert stats.sign_test_p([0.05] * 5 + [0.0, 0.0]) == pytest.approx(0.0625)  # ties dropped
    assert stats.sign_test_p([0.1, 0.1, 0.1, 0.1, 0.1, -0.1]) == pytest.approx(14 / 64)
    assert stats.sign_test_p([0.1, -0.1]) == 1.0
    assert stats.sign_test_p([]) == 1.0
    assert stats.sign_test_p([0.0, 0.0]) == 1.0


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 6, 9, 14, 30, 101])
def test_students_t_matches_scipy(df):
    scipy_stats = pytest.importorskip("scipy.stats")
    t = np.array([0.0, 0.3, 1.0, 2.0, 4.0, 12.0, 300.0])
    assert rule.t_two_sided_p(t, df) == pytest.approx(2 * scipy_stats.t.sf(t, df), abs=1e-12)
    for alpha in (0.04, 0.04 / 7, 0.001):
        assert rule.t_critical(alpha, df) == pytest.approx(
            scipy_stats.t.ppf(1 - alpha / 2, df), rel=1e-9)


def test_students_t_known_values():
    assert rule.t_two_sided_p(np.array(1.0), 1) == pytest.approx(0.5)  # Cauchy
    assert rule.t_critical(0.05, 2) == pytest.approx(4.302653, rel=1e-6)
    assert rule.t_critical(0.05, 30) == pytest.approx(2.042272, rel=1e-6)


# The planted slowdown on the H200 (issue 21): the arm read -3.5, -3.4, -3.4, -3.9% in its four
# rounds at c=1 and the A/A copy +0.1 to +0.2%; the sign rule alone could only say too few.
PLANTED = {"planted": [-0.035, -0.034, -0.034, -0.039], "aa": [0.001, 0.002, 0.0015, 0.002]}


def test_the_h200_planted_slowdown_is_slower_and_its_aa_within_noise():
    records = _session(PLANTED, concurrency=1)
    planted = _verdict(records, "planted", aa_arm="aa")
    assert (planted["verdict"], planted["rule"]) == ("slower", "t")
    assert planted["noise_arms"] == "aa" and planted["rounds"] == 4
    assert planted["estimate"] == pytest.approx(-0.0355, abs=2e-4)
    assert planted["ci_low"] < planted["estimate"] < planted["ci_high"] < -0.01
    assert planted["p_sign"] == pytest.approx(0.125)  # 4 of one sign: no verdict by signs
    aa = _verdict(records, "aa", aa_arm="aa")
    assert aa["verdict"] == "within noise"  # +0.15% every round: consistent, under the floor
    assert aa["noise_arms"] == ""  # the A/A arm is judged against the baseline alone
    assert -0.01 < aa["ci_low"] < aa["ci_high"] < 0.01
    # judged after every round, the planted arm is called at the second look already
    sequential = _verdict(records, "planted", aa_arm="aa", design=rule.Design(True, 8))
    assert (sequential["verdict"], sequential["decided_at"]) == ("slower", 2)


# The same gate over up to 5 rounds (results/2026-12-02-h200-0.8b-planted-5), c=1.
PLANTED_5 = {"planted": [-0.0306, -0.039, -0.0333, -0.0373, -0.0344],
             "aa": [0.0047, -0.0003, 0.0052, 0.0011, 0.0029]}


def test_the_h200_five_round_gate_decides_each_arm_at_its_look():
    """planted is called at the second look; the A/A copy, +0.3% with rounds 0.5% apart, needs
    all five before its 99% interval lies inside the 1% floor."""
    records = _session(PLANTED_5, concurrency=1)
    design = rule.Design(True, 5)
    planted = _verdict(records, "planted", aa_arm="aa", design=design)
    assert (planted["verdict"], planted["decided_at"]) == ("slower", 2)
    aa = _verdict(records, "aa", aa_arm="aa", design=design)
    assert (aa["verdict"], aa["decided_at"]) == ("within noise", 5)
    assert -0.01 < aa["ci_low"] < 0 < aa["ci_high"] < 0.01
    early = _verdict(_session({k: v[:4] for k, v in PLANTED_5.items()}, concurrency=1), "aa",
                     aa_arm="aa", design=design)
    assert early["verdict"] == "too few rounds"  # four rounds in, its interval still reaches 1%


def test_the_aa_arm_adds_its_rounds_to_the_noise_model():
    """Two rounds of an arm alone give one degree of freedom; an A/A arm of the same noise
    makes it two, and the interval narrows enough for a verdict."""
    deltas = {"head": [-0.03, -0.045], "aa": [0.004, -0.004]}
    alone = _verdict(_session(deltas), "head")
    assert alone["verdict"] == "too few rounds" and alone["ci_high"] > 0
    with_aa = _verdict(_session(deltas), "head", aa_arm="aa")
    assert with_aa["verdict"] == "slower" and with_aa["ci_high"] < 0
    assert with_aa["estimate"] == pytest.approx(alone["estimate"])


@pytest.mark.parametrize("deltas, verdict, by", [
    ([0.05] * 6, "faster", "t"),  # zero spread: the interval is the estimate
    ([-0.05, -0.04, -0.06, -0.05, -0.045, -0.055], "slower", "t"),
    ([0.03, 0.04, 0.05, 0.03, 0.04, 0.05, 0.03, 0.04], "faster", "t+sign"),  # 8 of one sign
    # one wild round widens the t interval past 0; 8 rounds of one sign still call it
    ([0.03, 0.02, 0.03, 0.04, 0.02, 0.03, 0.03, 3.0], "faster", "sign"),
    ([0.012, 0.013, 0.012, 0.013, 0.012, 0.013], "faster", "t"),  # just over the 1% floor
    ([0.008, 0.007, 0.008, 0.007, 0.008, 0.007], "within noise", "-"),  # consistent, under it
    ([0.004, -0.003, 0.002, -0.004, 0.003, -0.002], "within noise", "-"),
    # the median clears 1% many times over, but mixed signs keep the interval across 0
    ([0.05, 0.05, 0.05, 0.05, 0.05, -0.05], "too few rounds", "-"),
    ([0.08, 0.06, 0.05, 0.05, 0.04, -0.01, -0.02, -0.03], "too few rounds", "-"),
])
def test_verdicts_on_golden_rounds(deltas, verdict, by):
    row = _verdict(_session({"head": deltas}), "head")
    assert (row["verdict"], row["rule"] or "-") == (verdict, by)
    assert row["rounds"] == len(deltas)


def test_one_round_is_too_few_and_a_fixed_design_judges_every_round():
    row = _verdict(_session({"head": [0.5]}), "head")
    assert row["verdict"] == "too few rounds" and row["rounds"] == 1
    # slower in rounds 1-3, faster after: a fixed design sees all six and no verdict; judged
    # after every round the cell was decided at its third and keeps that verdict
    deltas = {"head": [-0.05, -0.05, -0.05, 0.06, 0.06, 0.06]}
    assert _verdict(_session(deltas), "head")["verdict"] == "too few rounds"
    sequential = _verdict(_session(deltas), "head", design=rule.Design(True, 8))
    assert (sequential["verdict"], sequential["decided_at"]) == ("slower", 2)


def test_the_frame_path_is_the_rules_path():
    """stats.verdicts (runs.jsonl -> frame -> round medians) gives what rule.decide gives on
    the log round values: the simulation judges what a report judges."""
    deltas = {"head": [-0.02, 0.01, -0.03, -0.015, -0.025], "aa": [0.01, -0.012, 0.0, 0.004,
                                                                    -0.006]}
    row = _verdict(_session(deltas), "head", aa_arm="aa")
    base = np.log(_base(5))
    values = np.stack([base, base + np.log1p(deltas["head"]), base + np.log1p(deltas["aa"])],
                      axis=1)
    judged = rule.decide(values[np.newaxis], rule.FIXED)
    assert row["verdict"] == rule.VERDICT_NAMES[int(judged.code[0])]
    assert row["estimate"] == pytest.approx(float(judged.estimate[0]))
    assert row["ci_low"] == pytest.approx(float(judged.ci_low[0]))


def test_rounds_without_the_aa_arm_are_left_out_of_its_design():
    records = _session({"head": [-0.05] * 4, "aa": [0.0] * 4})
    records = [r for r in records if not (r.arm == "aa" and r.round == 3)]
    row = _verdict(records, "head", aa_arm="aa")
    assert row["rounds"] == 3 and row["noise_arms"] == "aa"


def test_design_validation():
    with pytest.raises(ValueError, match="--max-rounds"):
        rule.Design(until_verdict=True, max_rounds=1)
    with pytest.raises(ValueError, match="--min-effect"):
        rule.Design(min_effect=0.0)
    assert rule.Design(True, 8).looks == 7 and rule.FIXED.looks == 1
    assert rule.Design(True, 8).alpha_t == pytest.approx(rule.ALPHA_T / 7)


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
    assert row["base_value"] == 120.0
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


def test_no_baseline_runs_gives_too_few_rounds():
    frame = stats.runs_frame(_records("head", _base(6)))
    assert stats.paired_deltas(frame, "main").empty
    table = stats.verdicts(frame, "main")
    assert list(table["verdict"]) == ["too few rounds"] and list(table["rounds"]) == [0]


def _slot_records(slots: dict[int, list[tuple[float, float]]]) -> list[RunRecord]:
    """An interleaved session at c=1: per round, (main, head) tok/s of each slot (run 1, 2, ...)."""
    return [RunRecord(round=round_index, arm=arm, position=0, concurrency=1, run=run_no,
                      ok=True, metrics=_metrics(tok, 1))
            for round_index, pairs in slots.items()
            for run_no, pair in enumerate(pairs, start=1)
            for arm, tok in zip(("main", "head"), pair, strict=True)]


def test_interleaved_rounds_pair_each_run_with_the_baselines_beside_it():
    # the host's speed moves slot to slot (100, 60, 58); head reads 0.90, 0.95 and 0.90 of main
    # in the same slots: by slot the round is -10%, while its medians (57 against 60) say -5%
    slots = {0: [(100.0, 90.0), (60.0, 57.0), (58.0, 52.2)],
             1: [(80.0, 72.0), (81.0, 72.9), (40.0, 48.0)]}
    frame = stats.runs_frame(_slot_records(slots))
    by_medians = stats.paired_deltas(frame, "main")
    by_slot = stats.paired_deltas(frame, "main", slots=True)
    assert list(by_medians["delta"]) == pytest.approx([57.0 / 60.0 - 1, 72.0 / 80.0 - 1])
    assert list(by_slot["delta"]) == pytest.approx([-0.10, -0.10])  # round 1's +20% slot is out
    assert list(by_slot.columns) == list(stats.PAIRED_COLUMNS)
    assert list(by_slot["base_value"]) == [60.0, 80.0]  # the round's medians, as reported
    # the rule's input: each arm's median of its log tok/s less the slot's mean, per round
    table = stats.round_table(frame, 1, ["main", "head"], slots=True)
    assert list(table.index) == [0, 1]
    assert (table["head"] - table["main"]).to_numpy() == pytest.approx(np.log([0.9, 0.9]))
    assert (table.sum(axis=1)).to_numpy() == pytest.approx([0.0, 0.0])
    fixed = stats.verdicts(frame, "main", slots=True)
    assert fixed.iloc[0]["estimate"] == pytest.approx(-0.10)


def test_slots_missing_an_arm_are_left_out():
    records = _slot_records({0: [(100.0, 90.0), (60.0, 54.0)]})
    records[2] = dataclasses.replace(records[2], ok=False, metrics=None)  # slot 2's main failed
    table = stats.round_table(stats.runs_frame(records), 1, ["main", "head"], slots=True)
    assert (table["head"] - table["main"]).to_numpy() == pytest.approx(np.log([0.9]))
    assert stats.round_table(stats.runs_frame(records[:1]), 1, ["main", "head"], slots=True).empty


def _open_loop_records(arm: str, ttft_ms: list[float]) -> list[RunRecord]:
    """One ok run per round at the same tok/s (an open loop's arrival rate), round i's TTFT p50
    at ttft_ms[i]."""
    return [RunRecord(round=i, arm=arm, position=0, concurrency=16, run=1, ok=True,
                      metrics=dataclasses.replace(_metrics(1000.0), median_ttft_ms=value))
            for i, value in enumerate(ttft_ms)]


def test_an_open_loop_is_judged_on_ttft_not_on_the_arrival_rate():
    """Equal tok/s in every run (the arrival rate) and head's TTFT p50 a fifth lower each round:
    judged on tok/s nothing tells the arms apart; judged on TTFT (measure_of an open-loop
    manifest) head is faster by 1 / 0.8 - 1 = 25%."""
    base = [20.0 + 3.0 * i for i in range(4)]
    records = _open_loop_records("main", base) + _open_loop_records(
        "head", [0.8 * value for value in base])
    by_tok_s = stats.verdicts(stats.runs_frame(records), "main")
    assert by_tok_s.iloc[0]["verdict"] != "faster"
    by_ttft = stats.verdicts(stats.runs_frame(records, "ttft"), "main")
    assert by_ttft.iloc[0]["verdict"] == "faster"
    assert by_ttft.iloc[0]["estimate"] == pytest.approx(0.25)
    paired = stats.paired_deltas(stats.runs_frame(records, "ttft"), "main")
    assert paired["base_value"].tolist() == pytest.approx([1000.0 / value for value in base])
    assert stats.measure_of(Manifest(request_rate={"c=16": 25.0})) == "ttft"
    assert stats.measure_of(Manifest()) == "tok/s"
    with pytest.raises(ValueError, match="unknown measure 'itl'"):
        stats.runs_frame(records, "itl")
