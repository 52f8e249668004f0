"""`resident-gate run --resume`: continuing the session in --out. The session must be this one
(RESUME_KEYS and the arms' names, specs and knobs match the manifest, and each resident arm's
tree still holds the code its earlier rounds ran, by source digest, checked before any server
starts); the rounds runs.jsonl holds whole stay, a partial round is dropped to run again, and the
manifest logs the resumption. The code and weights are checked again as each server starts
(measure.py): what a server loaded, not only what its tree holds."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from gate.config import GateConfig
from gate.manifest import Manifest, Resumption
from gate.records import RUNS_FILE, RunRecord, read_runs, rewrite_runs
from gate.verdict.rule import MIN_EFFECT
from resident.provenance import source_digest

# what must match between a session's manifest and a run that resumes it, and the value of those
# an older manifest lacks
RESUME_KEYS = ("baseline", "aa_arm", "model", "device", "cells", "prompt_len", "output_len",
               "runs", "requests", "seed", "until_verdict", "min_effect", "interleave",
               "shared_prefix_len", "sampling", "request_rate")
RESUME_DEFAULTS = {"until_verdict": False, "min_effect": MIN_EFFECT, "interleave": False,
                   "shared_prefix_len": 0,
                   "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0}}


def completed_rounds(records: list[RunRecord], arms: list[str], cells: tuple[int, ...],
                     runs: int) -> int:
    """How many leading rounds hold a record (ok or failed) of every arm, cell and run."""
    have = {(r.round, r.arm, r.concurrency, r.run) for r in records}
    count = 0
    while all((count, arm, cell, run) in have for arm in arms for cell in cells
              for run in range(1, runs + 1)):
        count += 1
    return count


def resume_manifest(out: Path, fresh: Manifest, config: GateConfig,
                    command_line: list[str]) -> tuple[int, Manifest]:
    """Checks that `out` holds the session whose manifest this invocation would write
    (`fresh`), drops its partial round from runs.jsonl and logs the resumption; returns the
    first round to run and the session's manifest."""
    if not (out / RUNS_FILE).exists():
        raise ValueError(f"--resume: {out} holds no session to resume")
    manifest = Manifest.read(out)
    ours, theirs = fresh.to_dict(), manifest.to_dict()
    for key in RESUME_KEYS + ("arms",):
        if key == "arms":  # the code itself is checked by digest as each server starts
            mine, recorded = ([[a.name, a.spec, a.knobs] for a in m.arms]
                              for m in (fresh, manifest))
        else:
            mine, recorded = ours[key], theirs.get(key)
            if recorded is None:  # a manifest from before the key
                recorded = RESUME_DEFAULTS.get(key)
        if mine != recorded:
            raise ValueError(f"--resume: {key} is {mine} here but {recorded} in {out}")
    _check_sources(fresh, manifest)
    records = read_runs(out)
    first = completed_rounds(records, fresh.arm_names, config.concurrency, config.runs)
    rewrite_runs(out, [r for r in records if r.round < first])
    resumption = Resumption(at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), from_round=first,
                            command=tuple(command_line), host=fresh.host,
                            versions=fresh.versions, removed_env=fresh.removed_env)
    return first, dataclasses.replace(manifest, rounds=config.planned_rounds,
                                      max_rounds=config.max_rounds,
                                      resumed=(*manifest.resumed, resumption))


def _check_sources(fresh: Manifest, manifest: Manifest) -> None:
    """Refuses the resume when a resident arm's tree holds other code than the session's earlier
    rounds ran (the source digest their servers reported), before any server starts: else every
    server of the round starts, fails its digest check and fails the round's runs, a whole
    start-up spent (1-2 minutes a server on a fresh GPU machine)."""
    recorded = {arm.name: arm.source_digest for arm in manifest.arms}
    for arm in fresh.arms:
        digest = recorded.get(arm.name)
        if arm.kind != "resident" or not digest or not arm.tree:
            continue
        here = source_digest(Path(arm.tree) / "resident")
        if here != digest:
            raise ValueError(f"--resume: arm {arm.name}'s tree {arm.tree} holds other code than "
                             f"the session's earlier rounds ran (source digest {here[:12]}, "
                             f"not {digest[:12]}): a session's rounds run one tree; start "
                             "another session (another --out)")


def first_fingerprint(manifest: Manifest) -> str | None:
    """The weights fingerprint of the first arm the session's earlier rounds measured."""
    fingerprints = [a.debug_config.get("weights_fingerprint")
                    for a in manifest.arms if a.debug_config]
    return fingerprints[0] if fingerprints else None
