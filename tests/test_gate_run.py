"""`resident-gate run` and `report` through typer's CliRunner against real tiny CPU servers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from gate.cli import app
from gate.manifest import ArmEntry, Manifest
from gate.records import read_runs
from gate.run.arms import resolve_arm
from gate.run.measure import check_source
from gate.run.server import ServerFailed
from gate.verdict.stats import paired_deltas, runs_frame

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--model", "tiny", "--device", "cpu", "--prompt-len", "16", "--output-len", "8",
         "--requests", "4", "--startup-timeout", "120"]


# Every process a gate run starts inherits this variable, set to the run's own id: the gate
# passes its environment on to the servers it launches, less RESIDENT_* (gate/run/server.py).
RUN_ID = "GATE_TEST_RUN_ID"


def invoke(*args: str):
    """`resident-gate ARGS` from the repository root; the result's run_id names the run."""
    run_id = uuid.uuid4().hex
    runner = CliRunner()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        result = runner.invoke(app, list(args),
                               env={"COLUMNS": "200", "NO_COLOR": "1", RUN_ID: run_id})
    finally:
        os.chdir(cwd)
    result.run_id = run_id
    return result


def servers_left(result, grace_s: float = 5.0) -> list[str]:
    """Command lines of the live processes that the gate run behind `result` started (its servers
    and their children, whatever else runs on the machine), after up to grace_s for a process
    group the gate just killed to go."""
    marker = f"{RUN_ID}={result.run_id}".encode()
    deadline = time.monotonic() + grace_s
    while True:
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if marker not in (proc / "environ").read_bytes().split(b"\0"):
                    continue  # a zombie's environ reads empty
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:  # gone, or not ours to read
                continue
            command = b" ".join(args).decode(errors="replace")
            # the load's client processes leave multiprocessing's resource tracker to this
            # (pytest's) process, where the gate runs in-process; it ends with it
            if "multiprocessing.resource_tracker" not in command:
                found.append(command)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_servers_left_finds_a_runs_processes_and_no_others():
    """Only the processes carrying the run's id count, not another `resident serve --host`."""
    ours, other = (SimpleNamespace(run_id=uuid.uuid4().hex) for _ in range(2))
    command = [sys.executable, "-c", "import time; time.sleep(60)", "resident", "serve", "--host"]
    processes = [subprocess.Popen(command, env={**os.environ, RUN_ID: ours.run_id}),
                 subprocess.Popen(command)]
    try:
        found = servers_left(ours, grace_s=0)
        assert len(found) == 1 and "resident serve --host" in found[0]
        assert not servers_left(other, grace_s=0)
    finally:
        for process in processes:
            process.kill()
            process.wait()
    assert not servers_left(ours, grace_s=0)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    out = tmp_path_factory.mktemp("gate") / "session"
    # the head serves with its prefix cache on (a snapshot every page) and every prompt opens
    # with one 32-token prefix: after the warm-up (two requests a slot: the second wave
    # snapshots the prefix), each of its requests restores 2 pages. 24 output tokens, not
    # SHORT's 8: the summary reads a server's CPU only where the runs' median is 0.1 s or more
    # (/proc's ticks), and on an idle 2-core host 8-token runs put the engine core's at 0.08-0.14
    result = invoke("run", "--arm", "main=.", "--arm", "head=.",
                    "--set", "main.resident_planning=off", "--set", "main.prefix_cache=off",
                    "--set", "dtype=float32",
                    "--set", "head.prefix_cache=on", "--set", "head.prefix_snapshot_interval=1",
                    "--shared-prefix-len", "32",
                    "--concurrency", "1,2", "--rounds", "2", "--runs", "2", "--clients", "2",
                    "--out", str(out), "--format", "json", *SHORT, "--output-len", "24")
    return out, result


def test_a_session_writes_everything(session):
    out, result = session
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    cells = {(row["cell"], row["arm"]) for row in summary["cells"]}
    assert cells == {(c, a) for c in ("c=1", "c=2") for a in ("main", "head")}
    runs = read_runs(out)
    assert len(runs) == 2 * 2 * 2 * 2 and all(r.ok for r in runs)
    assert all(r.metrics.total_output_tokens == 4 * 24 for r in runs)
    # --clients 2: c=2's slots from two client processes, c=1's from one
    assert [r.num_clients for r in runs] == [r.concurrency for r in runs]
    assert [r.arm for r in runs if r.concurrency == 1 and r.run == 1] == [
        "main", "head", "head", "main"]  # ABBA
    assert all(r.steps.get("decode", 0) > 0 for r in runs)
    # the servers' step times, from /metrics: every run decodes, and at c=1 each request's
    # prompt is a prefill step of its own
    assert all(r.step_ms.get("decode", 0) > 0 for r in runs)
    assert all(r.step_ms.get("prefill", 0) > 0 for r in runs if r.concurrency == 1)
    # the warm-up comes before the first run's counters are read: one prefill a request
    assert all(r.steps.get("prefill") == r.metrics.completed for r in runs if r.concurrency == 1)
    for name in ("manifest.json", "rounds.md", "summary.md", "summary.json", "paired.md",
                 "tok_s.png", "itl.png"):
        assert (out / name).is_file(), name
    # the servers' prefix cache counters over each run: every head request hit, main has none
    assert all(r.prefix == {"hits": r.metrics.completed, "saved_tokens": 32 * r.metrics.completed}
               for r in runs if r.arm == "head")
    assert all(r.prefix == {"hits": 0, "saved_tokens": 0} for r in runs if r.arm == "main")
    # late launch is off on CPU (auto): its counter is there and took nothing
    assert all(r.window_arrivals == 0 for r in runs)
    assert ("- c=1: prefix cache hits over the runs: main 0 of 16 requests; head 16 of 16 "
            "requests (32 prompt tokens restored a hit).") in (out / "summary.md").read_text()
    manifest = Manifest.read(out).to_dict()
    configs = {a["name"]: a["debug_config"] for a in manifest["arms"]}
    assert configs["main"]["planning_mode"] == "off"
    assert configs["head"]["planning_mode"] == "resident"
    assert configs["main"]["resident_package_path"] == str(ROOT / "resident")
    assert manifest["placement"]["overlap"] == (os.cpu_count() < 4)
    # every server's start-up was timed, and the session's wall time holds them all
    servers = manifest["timing"]["servers"]
    assert sorted((s["round"], s["arm"]) for s in servers) == [
        (r, a) for r in (0, 1) for a in ("head", "main")]
    assert all(0 < s["health_s"] < 120 and s["stop_s"] >= 0 for s in servers)
    # and where each engine core's start went, as its log says too
    assert all({"imports", "model", "buffers", "total"} <= set(s["startup"])
               and 0 < s["startup"]["total"] < s["health_s"] for s in servers)
    assert all("start-up " in log.read_text() for log in (out / "logs").glob("*.log"))
    # each engine core compiled into its round's Inductor cache and the gate's one Triton cache
    assert all(s["caches"]["inductor"].endswith(f"/{out.name}/round-{s['round']}")
               for s in servers)
    triton = (Path.cwd() / ".gate" / "triton").resolve()
    assert {s["caches"]["triton"] for s in servers} == {str(triton)}
    # and read the environment's bytecode, or where it is not kept, the gate's (bytecode.py)
    pycache = (Path.cwd() / ".gate" / "pycache").resolve()
    assert {s["caches"]["bytecode"] for s in servers} in ({None}, {str(pycache)})
    timing = json.loads((out / "summary.json").read_text())["timing"]
    span = max(r.started_at for r in runs) - min(r.started_at for r in runs)
    assert timing["wall_s"] > max(timing["startup_s"], span + servers[0]["health_s"])
    assert timing["startup_s"] == pytest.approx(sum(s["health_s"] for s in servers), abs=1e-3)
    assert "Time: the session took" in (out / "summary.md").read_text()
    # the CPU over each run: the engine core (a descendant) decodes on the CPU here, the API
    # process streams every token and the gate's client reads them, so each used some
    # (/proc counts server CPU in 10 ms ticks: a 0.1 s run's API process may read 0)
    assert all(r.api_cpu_s >= 0 and r.core_cpu_s > 0 and r.client_cpu_s > 0 for r in runs)
    assert sum(r.api_cpu_s for r in runs) > 0
    assert all(row["core_cpu_share"] > 0 and row["client_cpu_share"] > 0
               for row in summary["cells"])
    assert "## Server and client CPU" in (out / "summary.md").read_text()
    assert not servers_left(result)


def test_report_reproduces_the_tables(session, tmp_path):
    out, _ = session
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for name in ("rounds.md", "summary.md", "paired.md"):
        (copy / name).unlink()
    result = invoke("report", str(copy), "--format", "md")
    assert result.exit_code == 0, result.output
    for name in ("rounds.md", "summary.md", "paired.md"):
        assert (copy / name).read_text() == (out / name).read_text(), name


def test_a_git_arm_runs_its_own_commit(tmp_path):
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"],
                           capture_output=True, text=True).stdout.split()
    older = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%H", "-n", "1",
                            "--", "resident/server/serve.py"], capture_output=True,
                           text=True).stdout.strip()
    assert first and older
    out = tmp_path / "git-arm"
    result = invoke("run", "--arm", f"old=git:{older}", "--concurrency", "1", "--rounds",
                    "1", "--runs", "1", "--out", str(out), *SHORT)
    assert result.exit_code == 0, result.output
    arm = Manifest.read(out).to_dict()["arms"][0]
    assert arm["sha"] == older
    worktree = Path(arm["tree"])
    assert worktree.parent == (ROOT / ".gate" / "worktrees").resolve()
    assert arm["debug_config"]["resident_package_path"] == str(worktree / "resident")
    assert not str(worktree).startswith(str(out))
    assert not servers_left(result)


def test_a_cmd_arm_that_exits_at_once_fails_cleanly(tmp_path):
    out = tmp_path / "cmd-arm"
    # the server prints the run id it inherited: what servers_left finds a run's servers by
    command = f"python3 -c 'import os, sys; print(os.environ[\"{RUN_ID}\"]); sys.exit(3)' {{port}}"
    result = invoke("run", "--arm", f"broken=cmd:{command}", "--concurrency", "1,2",
                    "--rounds", "3", "--runs", "2", "--out", str(out), *SHORT)
    assert result.exit_code == 1
    runs = read_runs(out)
    assert len(runs) == 4 and not any(r.ok for r in runs)  # round 1 only: no second try
    assert Manifest.read(out).to_dict()["stopped"]["reason"].startswith("broken could not start")
    assert "exited with code 3" in runs[0].error
    assert result.run_id in runs[0].log_tail
    assert "failed" in result.stderr
    assert not servers_left(result)


def test_servers_started_together_that_run_out_of_memory_are_told_why(tmp_path):
    """Two arms up together whose servers each log an engine core's out-of-memory error and
    exit: each failure names that error, and the session's failures say what to do."""
    out = tmp_path / "oom"
    said = ("2026-12-05 18:02:40,147 resident.serve ERROR the engine core failed: "
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.12 GiB")
    command = f"python3 -c 'import sys; print(\"{said}\"); sys.exit(1)' {{port}}"
    result = invoke("run", "--arm", f"one=cmd:{command}", "--arm", f"two=cmd:{command}",
                    "--interleave", "--parallel-start", "--concurrency", "1", "--rounds", "1",
                    "--runs", "1", "--out", str(out), *SHORT)
    assert result.exit_code == 1
    runs = read_runs(out)
    assert len(runs) == 2 and all(
        r.error.endswith("before it was ready: the engine core failed: OutOfMemoryError: CUDA "
                         "out of memory. Tried to allocate 1.12 GiB") for r in runs)
    output = " ".join(result.output.split())
    assert ("2 servers started together on one device and ran out of its memory: start them "
            "in turn (leave out --parallel-start)") in output
    assert not servers_left(result)


def test_a_resumed_session_reruns_a_partial_round_and_adds_rounds(tmp_path):
    """One round, then a fake partial second round (as a session killed mid-round leaves),
    then --resume with two rounds: the partial round is dropped and run again."""
    out = tmp_path / "resumed"
    one_round = ["run", "--arm", "main=.", "--concurrency", "1", "--runs", "2", "--out",
                 str(out), *SHORT]
    result = invoke(*one_round, "--rounds", "1")
    assert result.exit_code == 0, result.output
    again = invoke(*one_round, "--rounds", "1")
    assert again.exit_code == 2 and "--resume" in " ".join(again.output.split())
    partial = json.loads(read_runs(out)[0].to_json()) | {"round": 1}
    partial["metrics"]["output_throughput"] = -1.0
    with (out / "runs.jsonl").open("a") as runs_file:
        runs_file.write(json.dumps(partial) + "\n")
    wrong = invoke(*one_round, "--rounds", "2", "--resume", "--prompt-len", "8")
    assert wrong.exit_code == 2 and "prompt_len" in " ".join(wrong.output.split())
    result = invoke(*one_round, "--rounds", "2", "--resume")
    assert result.exit_code == 0, result.output
    runs = read_runs(out)
    assert [(r.round, r.run, r.ok) for r in runs] == [
        (0, 1, True), (0, 2, True), (1, 1, True), (1, 2, True)]
    assert all(r.metrics.output_throughput > 0 for r in runs)
    manifest = Manifest.read(out).to_dict()
    assert manifest["rounds"] == 2 and manifest["resumed"][0]["from_round"] == 1
    assert "| r2 |" in (out / "rounds.md").read_text()
    # a third round on other code than the first two ran is refused before a server starts
    manifest["arms"][0]["debug_config"]["source_digest"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    result = invoke(*one_round, "--rounds", "3", "--resume")
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "arm main's tree" in said and "not 000000000000" in said
    assert {r.round for r in read_runs(out)} == {0, 1}
    assert not servers_left(result)


def test_a_server_that_loaded_other_code_than_the_session_ran_fails():
    """What a server reports is checked too (measure.check_source): its package may not be
    what its tree holds (a path that shadows it)."""
    entry = ArmEntry("main", debug_config={"source_digest": "a" * 64})
    arm = resolve_arm("main", ".", ROOT, ROOT / ".gate" / "worktrees", {})
    check_source(arm, entry, {"source_digest": "a" * 64}, "")
    with pytest.raises(ServerFailed, match="source digest b+ differs from a+"):
        check_source(arm, entry, {"source_digest": "b" * 64}, "")


def test_a_path_arm_names_its_own_commit_never_an_enclosing_repositorys(tmp_path):
    """A source tree copied inside another repository (as under .gate/worktrees/) has no
    commit of its own: the manifest says none rather than the outer repository's HEAD; the
    repository's own root names its HEAD, and whether tracked files changed."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t",
                               "-c", "user.email=t@t", *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    for tree in (tmp_path, tmp_path / "copy"):
        (tree / "resident").mkdir(parents=True)
        (tree / "resident" / "__init__.py").write_text("")
    git("init", "-q")
    git("add", "resident")
    git("commit", "-qm", "root")
    worktrees = tmp_path / ".gate" / "worktrees"
    copy = resolve_arm("copy", f"path:{tmp_path / 'copy'}", tmp_path, worktrees, {})
    assert copy.sha is None and not copy.dirty
    root = resolve_arm("root", ".", tmp_path, worktrees, {})
    assert root.sha == git("rev-parse", "HEAD") and not root.dirty
    (tmp_path / "resident" / "__init__.py").write_text("# changed\n")
    assert resolve_arm("root", ".", tmp_path, worktrees, {}).dirty


def test_until_verdict_stops_when_every_cell_has_a_verdict(tmp_path):
    """Tiny servers on the CPU: an arm capped at one sequence serves c=8 at a fraction of the
    baseline's tok/s, so it is `slower` after two or three rounds, well before the sixth."""
    out = tmp_path / "until"
    result = invoke("run", "--arm", "main=.", "--arm", "capped=.",
                    "--set", "capped.max_num_seqs=1", "--concurrency", "8", "--runs", "1",
                    "--until-verdict", "--max-rounds", "6", "--out", str(out),
                    "--format", "json", "--model", "tiny", "--device", "cpu",
                    "--prompt-len", "16", "--output-len", "16", "--requests", "16",
                    "--startup-timeout", "120")
    assert result.exit_code == 0, result.output
    manifest = Manifest.read(out).to_dict()
    assert manifest["until_verdict"] and manifest["max_rounds"] == 6
    rounds = manifest["stopped"]["after_rounds"]
    assert manifest["stopped"]["reason"] == "every cell had a verdict" and 2 <= rounds < 6
    assert {r.round for r in read_runs(out)} == set(range(rounds))
    (row,) = [row for row in json.loads(result.stdout)["cells"] if row["arm"] == "capped"]
    assert row["verdict"] == "slower" and row["vs_baseline"] < -0.5
    assert f"stopping after {rounds} rounds" in " ".join(result.stderr.split())
    assert not servers_left(result)


def test_interleaved_rounds_alternate_the_arms_run_by_run(tmp_path):
    """--interleave --parallel-start: every server of a round launched together, slot j holding
    run j of each arm back to back, in the round's order on odd slots and reversed on even ones;
    the rounds judged slot by slot. A capped arm (one sequence at c=4) is `slower`: the A/A
    arm's rounds join the noise estimate, so two rounds give the t rule two degrees of freedom
    (one alone would need the two rounds' deltas within a few percent of each other, which a
    shared 2-core host does not give). Runs of 8 requests of 16 tokens, not SHORT's 4 of 8:
    under CI's load SHORT's runs were tens of ms, the A/A arm's rounds read -17% and +22%, and
    with them in the noise estimate the capped arm's -55% was left `too few rounds`."""
    out = tmp_path / "interleaved"
    result = invoke("run", "--arm", "main=.", "--arm", "capped=.", "--aa",
                    "--set", "capped.max_num_seqs=1", "--interleave", "--parallel-start",
                    "--concurrency", "1,4",
                    "--rounds", "2", "--runs", "3", "--out", str(out), "--format", "json",
                    *SHORT, "--requests", "8", "--output-len", "16")
    assert result.exit_code == 0, result.output
    manifest = Manifest.read(out).to_dict()
    assert manifest["interleave"] and manifest["parallel_start"]
    servers = manifest["timing"]["servers"]
    assert len(servers) == 6
    for round_index in (0, 1):  # each launched before any of its round was ready
        spans = [(s["launched_at"], s["launched_at"] + s["health_s"]) for s in servers
                 if s["round"] == round_index]
        assert max(start for start, _ in spans) < min(ready for _, ready in spans)
    startup = json.loads((out / "summary.json").read_text())["timing"]["startup_s"]
    assert startup < sum(s["health_s"] for s in servers)
    runs = sorted(read_runs(out), key=lambda r: r.started_at)
    for round_index, order in ((0, ["main", "main-aa", "capped"]),
                               (1, ["capped", "main-aa", "main"])):
        for concurrency in (1, 4):
            cell = [(r.run, r.arm) for r in runs
                    if r.round == round_index and r.concurrency == concurrency]
            assert cell == [(slot, arm) for slot in (1, 2, 3)
                            for arm in (order if slot % 2 else order[::-1])]
    frame = runs_frame(runs)
    by_slot = paired_deltas(frame, "main", slots=True)
    assert "runs alternating between arms" in (out / "rounds.md").read_text()
    paired = (out / "paired.md").read_text()
    for delta in by_slot["delta"]:
        assert f"{delta * 100:+.1f}%" in paired
    verdicts = {(row["cell"], row["arm"]): row["verdict"]
                for row in json.loads(result.stdout)["cells"]}
    assert verdicts[("c=4", "capped")] == "slower"
    assert not servers_left(result)


@pytest.mark.parametrize("start", [[], ["--parallel-start"]], ids=["in-turn", "parallel"])
def test_an_interleaved_server_that_fails_leaves_the_others_running(tmp_path, start):
    """An arm whose server cannot start (a KV pool no host holds: the knobs resolve, the
    engine's allocation fails) has its runs recorded failed; the other arm's runs of the round
    go on, and the session ends after that round; whether the round's servers start one after
    another or together."""
    out = tmp_path / "broken"
    result = invoke("run", "--arm", "main=.", "--arm", "broken=.", "--set",
                    f"broken.num_kv_pages={10**12}", "--interleave", *start, "--concurrency", "1",
                    "--rounds", "2", "--runs", "2", "--out", str(out), *SHORT)
    assert result.exit_code == 1
    runs = read_runs(out)
    assert [(r.arm, r.run, r.ok) for r in runs if r.arm == "main"] == [
        ("main", 1, True), ("main", 2, True)]
    broken = [r for r in runs if r.arm == "broken"]
    assert len(broken) == 2 and not any(r.ok for r in broken)
    assert all("can't allocate memory" in (r.log_tail or "") for r in broken)
    # the one line names the cause, the engine core's failure
    assert all("before it was ready: the engine core failed: RuntimeError:"
               in " ".join(r.error.split()) for r in broken)
    assert Manifest.read(out).to_dict()["stopped"]["after_rounds"] == 1
    assert not servers_left(result)


@pytest.mark.parametrize("args, message", [
    (["run", "--arm", "main"], "expected NAME=SPEC"),
    (["run", "--arm", "main=somewhere"], "SPEC must be git:<ref>, path:<dir>"),
    (["run", "--arm", "main=.", "--set", "head.page_size=8"], "no arm named 'head'"),
    (["run", "--arm", "main=.", "--arm", "head=.", "--set", "head.fused_decode=bogus"],
     "--set: arm head (.) cannot start with its knobs: knob fused_decode: 'bogus' is not one of"),
    (["run", "--arm", "main=.", "--concurrency", "1,x"], "expected integers"),
    (["run", "--arm", "main=.", "--server-cpus", "999"], "999"),
    (["run", "--arm", "main=.", "--sessions", "3"], "No such option: --sessions"),
    (["run", "--arm", "main=.", "--until-verdict"], "--until-verdict needs --max-rounds"),
    (["run", "--arm", "main=.", "--max-rounds", "3"], "goes with --until-verdict"),
    (["run", "--arm", "main=.", "--rounds", "3", "--until-verdict", "--max-rounds", "4"],
     "--rounds 3 and --until-verdict"),
    (["run", "--arm", "main=.", "--min-effect", "2"], "--min-effect must be a fraction"),
    (["run", "--arm", "main=.", "--clients", "-1"], "--clients must be >= 0, got -1"),
    (["run", "--arm", "main=.", "--parallel-start"], "--parallel-start goes with --interleave"),
    (["run", "--arm", "main=.", "--request-rate", "0"], "--request-rate must be > 0 and finite"),
    (["run", "--arm", "main=.", "--request-rate", "fast"], "--request-rate 'fast': expected "
     "numbers"),
    (["run", "--arm", "main=.", "--concurrency", "1,4,16", "--request-rate", "2,8"],
     "--request-rate 2.0,8.0: give one rate, or one per cell of --concurrency 1,4,16"),
    (["report", "/no/such/session"], "/no/such/session"),
    (["run", "--arm", "main=.", "--out", "/proc/no/session"],
     "--out /proc/no/session: cannot create it"),
    (["check", "--arm", "main=.", "--arm", "head=.", "--out", "/proc/no/check"],
     "--out /proc/no/check: cannot create it"),
])
def test_bad_options_are_named(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_a_killed_gate_leaves_no_server_behind(tmp_path):
    """SIGKILL gives the gate no chance to stop its servers, which run in sessions of their own:
    each dies with it (PR_SET_PDEATHSIG), the engine core with its server."""
    run = SimpleNamespace(run_id=uuid.uuid4().hex)
    env = {**os.environ, RUN_ID: run.run_id, "PYTHONPATH": str(ROOT)}
    gate = subprocess.Popen([sys.executable, "-m", "gate", "run", "--arm", "main=.",
                             "--concurrency", "1", "--runs", "1", "--out", str(tmp_path / "s"),
                             *SHORT], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any("resident serve" in line for line in servers_left(run, grace_s=0)):
            assert gate.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1)  # the server has spawned its core
    finally:
        gate.kill()
        gate.wait()
    assert not servers_left(run, grace_s=30)


def test_a_killed_gate_mid_run_leaves_no_client_process_behind(tmp_path):
    """Killed while two client processes stream: nothing of the run is left (the server dies
    with the gate, the clients with it: end_with_parent, tested below). 1,000 tokens a request
    keep the clients streaming for seconds; the warm-up before them runs as long (one request
    a slot at the output length), so more only waits."""
    run = SimpleNamespace(run_id=uuid.uuid4().hex)
    env = {**os.environ, RUN_ID: run.run_id, "PYTHONPATH": str(ROOT)}
    gate = subprocess.Popen([sys.executable, "-m", "gate", "run", "--arm", "main=.",
                             "--concurrency", "2", "--clients", "2", "--runs", "1",
                             "--out", str(tmp_path / "s"), *SHORT, "--output-len", "1000"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while sum("spawn_main" in line for line in servers_left(run, grace_s=0)) < 2:
            assert gate.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        gate.kill()
        gate.wait()
    assert not servers_left(run, grace_s=30)


_CHILD = ("import sys, time; from resident.lifecycle import end_with_parent; "
          "end_with_parent(int(sys.argv[1]), 9); print('ready', flush=True); time.sleep(60)")
_PARENT = ("import os, subprocess, sys, time; "
           "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())]); "
           "print(child.pid, flush=True); time.sleep(60)")


def test_end_with_parent_kills_a_child_whose_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "ready"
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
