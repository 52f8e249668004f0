"""The session's round loop with its servers replaced by synthetic runs: --until-verdict stops
once every cell has a verdict, runs to --max-rounds when one never comes, and a resumed session
that had stopped runs no more; the options that go together are checked."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from gate.commands.check import build_check_configs
from gate.config import GateConfig
from gate.manifest import Manifest
from gate.metrics import ServeMetrics
from gate.records import RunRecord, append_run, read_runs
from gate.report.write import write_reports
from gate.run.rounds import Round
from gate.run.session import Session

ROOT = Path(__file__).resolve().parents[1]


class SyntheticRound(Round):
    """A round whose arms' servers are replaced by runs of a known speed: each arm's tok/s in a
    round is 1000 x (1 + its effect) x (1 + noise drawn for that arm and round)."""

    async def serve_arm(self, arm, position: int) -> int:
        session = self.session
        rng = np.random.default_rng([self.index, sum(map(ord, arm.name))])
        for concurrency in self.config.concurrency:
            for run in range(1, self.config.runs + 1):
                tok_s = 1000.0 * (1 + session.effects.get(arm.name, 0.0)) * math.exp(
                    rng.normal(0, session.noise))
                metrics = ServeMetrics(max_concurrency=concurrency, duration=1.0, completed=8,
                                       failed=0, total_input_tokens=8, total_output_tokens=100,
                                       request_throughput=8.0, output_throughput=tok_s)
                append_run(self.out, RunRecord(round=self.index, arm=arm.name,
                                               position=position, concurrency=concurrency,
                                               run=run, ok=True, metrics=metrics))
        return 0


class SyntheticSession(Session):
    """A Session whose rounds are SyntheticRounds."""

    round_type = SyntheticRound
    effects: dict[str, float] = {}
    noise = 0.0


def _session(out: Path, effects: dict[str, float], noise: float, **options) -> Session:
    config = GateConfig(arms=("main=.", "head=."), concurrency=(1, 4), runs=1, out=str(out),
                        **options)
    session = SyntheticSession(config, ROOT, [sys.argv[0]])
    session.effects, session.noise = effects, noise
    return session


def test_until_verdict_stops_once_every_cell_has_one(tmp_path):
    session = _session(tmp_path / "s", {"head": -0.3}, 0.002, until_verdict=True,
                       max_rounds=8)
    assert session.run() == 0
    manifest = Manifest.read(session.out).to_dict()
    assert manifest["stopped"] == {"after_rounds": 2, "reason": "every cell had a verdict"}
    assert manifest["rounds_run"] == 2 and manifest["max_rounds"] == 8
    assert {r.round for r in read_runs(session.out)} == {0, 1}
    rows = write_reports(session.out)
    assert [row["verdict"] for row in rows if row["arm"] == "head"] == ["slower", "slower"]
    assert "2 of at most 8 rounds" in (session.out / "summary.md").read_text()


def test_a_verdict_at_the_last_round_is_one(tmp_path):
    session = _session(tmp_path / "s", {"head": -0.3}, 0.002, until_verdict=True,
                       max_rounds=2)
    session.run()
    assert Manifest.read(session.out).to_dict()["stopped"] == {"after_rounds": 2,
                                                     "reason": "every cell had a verdict"}


def test_until_verdict_runs_to_max_rounds_when_no_verdict_comes(tmp_path):
    """Noise of 20% a run and no effect: the interval stays wider than the 1% floor."""
    session = _session(tmp_path / "s", {}, 0.2, until_verdict=True, max_rounds=3)
    session.run()
    manifest = Manifest.read(session.out).to_dict()
    assert manifest["stopped"] == {"after_rounds": 3, "reason": "the planned rounds ran"}
    assert {r.round for r in read_runs(session.out)} == {0, 1, 2}
    rows = write_reports(session.out)
    assert {row["verdict"] for row in rows if row["arm"] == "head"} == {"too few rounds"}


def test_a_resumed_session_that_had_its_verdicts_runs_no_more(tmp_path):
    out = tmp_path / "s"
    _session(out, {"head": -0.3}, 0.002, until_verdict=True, max_rounds=8).run()
    again = _session(out, {"head": -0.3}, 0.002, until_verdict=True, max_rounds=10)
    again.run(resume=True)
    assert {r.round for r in read_runs(out)} == {0, 1}
    assert Manifest.read(out).to_dict()["max_rounds"] == 10
    with pytest.raises(ValueError, match="until_verdict"):
        _session(out, {}, 0.0, rounds=4).run(resume=True)


def test_a_fixed_design_runs_every_round(tmp_path):
    session = _session(tmp_path / "s", {"head": -0.3}, 0.002, rounds=3)
    session.run()
    assert Manifest.read(session.out).to_dict()["stopped"]["after_rounds"] == 3
    assert {r.round for r in read_runs(session.out)} == {0, 1, 2}


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "gate").glob("*.yaml")),
                         ids=lambda path: path.name)
def test_every_shipped_gate_config_builds(path):
    """The configs the README and tests/gpu/h200.sh name are valid as they stand (a check
    config through the check command's loader)."""
    if path.name.startswith("check-"):
        config, check = build_check_configs(path, {}, {})
        assert check.sweeps
    else:
        config = GateConfig.from_options(path, {})
    assert config.arms and config.planned_rounds >= 1


def test_a_command_line_until_verdict_overrides_a_files_rounds(tmp_path):
    config_file = tmp_path / "gate.yaml"
    config_file.write_text('arm: ["main=."]\nrounds: 4\n')
    config = GateConfig.from_options(config_file, {"until_verdict": True, "max_rounds": 6})
    assert config.until_verdict and config.planned_rounds == 6
    assert GateConfig.from_options(config_file, {}).planned_rounds == 4
    config_file.write_text('arm: ["main=."]\nrounds: 4\nuntil_verdict: true\nmax_rounds: 6\n')
    with pytest.raises(ValueError, match="--rounds 4 and --until-verdict"):
        GateConfig.from_options(config_file, {})


@pytest.mark.parametrize("options, message", [
    ({"until_verdict": True}, "--until-verdict needs --max-rounds"),
    ({"max_rounds": 4}, "--max-rounds 4 goes with --until-verdict"),
    ({"until_verdict": True, "max_rounds": 1}, "--max-rounds must be >= 2"),
    ({"min_effect": 1.5}, "--min-effect must be a fraction"),
    ({"concurrency": (1, 4, 16), "requests": (2, 4)}, "--requests 2,4: give one number, or one "
     "per cell of --concurrency 1,4,16"),
    ({"requests": (0,)}, "--requests must be >= 1, got 0"),
])
def test_options_that_go_together(options, message):
    with pytest.raises(ValueError, match=message):
        GateConfig(arms=("main=.",), **options)


def test_client_processes_follow_the_slots_and_the_client_cpus():
    config = GateConfig(arms=("main=.",))
    # one per 128 slots, at most one per client CPU, at least one
    assert [config.clients_for(c, 4) for c in (1, 64, 255, 256, 512, 1024)] == [1, 1, 1, 2, 4, 4]
    assert config.clients_for(256, 1) == 1
    # --clients wins, up to the slots
    assert GateConfig(arms=("main=.",), clients=3).clients_for(8, 1) == 3
    assert GateConfig(arms=("main=.",), clients=3).clients_for(2, 4) == 2


def test_request_rates_one_for_every_cell_or_one_per_cell(tmp_path):
    closed = GateConfig(arms=("main=.",))
    assert closed.rate_for(16) == 0.0 and closed.request_rates is None
    assert GateConfig(arms=("main=.",), request_rate=(2.5,)).request_rates == {
        "c=1": 2.5, "c=16": 2.5, "c=64": 2.5}
    config_file = tmp_path / "gate.yaml"
    config_file.write_text('arm: ["main=."]\nconcurrency: [16, 64]\nrequest_rate: [20, 80.5]\n')
    config = GateConfig.from_options(config_file, {})
    assert (config.rate_for(16), config.rate_for(64)) == (20.0, 80.5)
    assert GateConfig.from_options(config_file, {"request_rate": "4"}).rate_for(64) == 4.0
    for bad in ((float("inf"),), (-1.0,)):
        with pytest.raises(ValueError, match="--request-rate must be > 0 and finite"):
            GateConfig(arms=("main=.",), request_rate=bad)


def test_requests_per_run_one_for_every_cell_or_one_per_cell(tmp_path):
    assert [GateConfig(arms=("main=.",)).requests_for(c) for c in (1, 4, 64)] == [8, 16, 256]
    assert GateConfig(arms=("main=.",), requests=(5,)).requests_for(64) == 5
    config_file = tmp_path / "gate.yaml"
    config_file.write_text('arm: ["main=."]\nconcurrency: [1, 4]\nrequests: [2, 12]\n')
    config = GateConfig.from_options(config_file, {})
    assert (config.requests_for(1), config.requests_for(4)) == (2, 12)
    assert GateConfig.from_options(config_file, {"requests": "6"}).requests_for(4) == 6
    config_file.write_text('arm: ["main=."]\nrequests: 3\n')
    assert GateConfig.from_options(config_file, {}).requests_for(16) == 3
