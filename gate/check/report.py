"""What `resident-gate check` writes: check.json (the report: verdicts, agreements, divergences
with both sides' top logprobs, row-check readings), check.md (its tables) and answers.jsonl
(every answer: load, arm, prompt, tokens, finish reason, error; one a line), and the same tables
for stdout (gate/report/output.py renders them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gate.check.config import SEEDED_SAMPLING
from gate.check.judge import margin
from gate.check.load import Answer
from gate.manifest import Manifest
from gate.report.markdown import TableSpec, page_title
from gate.report.output import OutputFormat, render
from gate.report.timing import time_line

CHECK_JSON, CHECK_MD, ANSWERS_JSONL = "check.json", "check.md", "answers.jsonl"
TOKEN_SWEEPS = ("greedy", "concurrency", "seeded", "kv-pressure")


def _knobs_text(knobs: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "the arms' own knobs"


def _failed_text(failed: dict[str, int]) -> str:
    if not any(failed.values()):
        return "0"
    return ", ".join(f"{arm} {count}" for arm, count in failed.items())


def sweeps_table(report: dict[str, Any]) -> TableSpec:
    rows = [[name, sweep["verdict"], "; ".join(sweep["reasons"]) or "-"]
            for name, sweep in report["sweeps"].items()]
    return TableSpec("Sweeps", ["sweep", "verdict", "why"], rows, "lll")


def token_judgements(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(load, its token judgement) of every token sweep run, then the prefix sweep's loads."""
    sweeps = report["sweeps"]
    judged = [(name, sweeps[name]) for name in TOKEN_SWEEPS if name in sweeps]
    judged += list(sweeps.get("rows", {}).get("tokens", {}).items())
    return judged + list(sweeps.get("prefix", {}).get("loads", {}).items())


def _load_text(report: dict[str, Any], name: str) -> str:
    load = f"c={report['loads'][name]}"
    if name in report.get("varied_loads", ()):
        load += ", max_tokens varied"
    if name in ("kv-pressure", "slot-pressure"):
        load += f", {_knobs_text(report['launches'][name]['knobs'])}"
    elif name in ("prefix-first", "prefix-again"):
        load += ", shared preamble, heads: " + _knobs_text(
            report["launches"]["prefix-on"].get("head_knobs", {}))
    elif name == "prefix-off":
        load += ", shared preamble, cache off"
    return load


def tokens_table(report: dict[str, Any]) -> TableSpec | None:
    """Per token sweep (and prefix load): each head's prompts with the baseline's very tokens
    beside the yardstick's (the baseline against its second server)."""
    roles = report["roles"]
    base, heads = roles["baseline"], roles["heads"]
    rows = []
    for name, sweep in token_judgements(report):
        agreement = sweep["agreement"]
        load = _load_text(report, name)
        rows.append([name, load,
                     *(f"{agreement[h]['same']}/{agreement[h]['total']}" for h in heads),
                     f"{agreement[roles['yardstick']]['same']}/"
                     f"{agreement[roles['yardstick']]['total']}",
                     _failed_text(sweep["failed"]), sweep["verdict"]])
    if not rows:
        return None
    header = ["sweep", "load", *(f"{h} vs {base}" for h in heads),
              f"{base} vs {base} (yardstick)", "failed requests", "verdict"]
    return TableSpec("Greedy tokens against the baseline", header, rows,
                       "ll" + "r" * (len(heads) + 2) + "l")


def notes_table(report: dict[str, Any]) -> TableSpec | None:
    """The token loads whose count against the yardstick is weak (judge.noise_floor_note)."""
    rows = [[name, note] for name, sweep in token_judgements(report)
            for note in sweep.get("notes", ())]
    return TableSpec("Weak loads", ["sweep", "note"], rows, "ll") if rows else None


def _margin_text(top: dict[str, float] | None, own: int | None, rival: int | None) -> str:
    """A server's own token's logprob less its rival's: `n/a` where it reported none, `> x`
    where the rival is outside its top logprobs (x: the gap to the least of them)."""
    if top is None or own is None or rival is None:
        return "n/a"
    values = {int(k): v for k, v in top.items()}
    exact = margin(values, own, rival)
    if exact is not None:
        return f"{exact:.4f}"
    return f"> {values[own] - min(values.values()):.4f}" if own in values else "n/a"


def divergences_table(report: dict[str, Any]) -> TableSpec | None:
    """Each diverging prompt: the first divergent token, both tokens, and each side's margin
    (its own token's logprob less the other's)."""
    base = report["roles"]["baseline"]
    rows = []
    for name, sweep in token_judgements(report):
        for arm, divergences in sweep["divergences"].items():
            for d in divergences:
                base_token, arm_token = d["baseline_token"], d["arm_token"]
                rows.append([name, f"p{d['prompt']}", arm, str(d["index"]),
                             "end" if base_token is None else str(base_token),
                             "end" if arm_token is None else str(arm_token),
                             _margin_text(d["baseline_top"], base_token, arm_token),
                             _margin_text(d["arm_top"], arm_token, base_token),
                             "yes" if d["near_tie"] else "no"])
    if not rows:
        return None
    return TableSpec("Divergences", ["sweep", "prompt", "arm", "first divergent token",
                                       f"{base}'s token", "arm's token", f"margin in {base}",
                                       "margin in arm", "near-tie"], rows, "lllrrrrrl")


def rowcheck_text(reading: dict[str, Any]) -> str:
    return (f"{reading['mismatches']} mismatches over {reading['steps']} steps "
            f"({reading['rows']} rows), {reading['displaced']} displaced, "
            f"{reading['offloads']} offloads, {reading['slot_releases']} slot releases")


def rows_table(report: dict[str, Any]) -> TableSpec | None:
    rows_sweep = report["sweeps"].get("rows")
    if rows_sweep is None:
        return None
    rows = []
    for pressure, readings in rows_sweep["readings"].items():
        for arm, reading in readings.items():
            rows.append([pressure, arm, str(reading["planning_mode"]),
                         rowcheck_text(reading) if reading["status"] != "n/a" else "-",
                         str(reading["failed"]), reading["status"]])
    return TableSpec("Row check", ["pressure", "arm", "planning", "row check",
                                     "failed requests", "status"], rows, "lllrrl")


def prefix_table(report: dict[str, Any]) -> TableSpec | None:
    """Each head's prefix cache hits and saved tokens over both passes, and its row check."""
    prefix = report["sweeps"].get("prefix")
    if prefix is None:
        return None
    rows = []
    for arm, hits in prefix["hits"].items():
        counts = prefix["rowcheck"].get(arm) or {}
        rows.append([arm, str(hits), str(prefix["saved_tokens"].get(arm, 0)),
                     f"{counts.get('mismatches', 0)} mismatches over {counts.get('steps', 0)} "
                     f"steps ({counts.get('rows', 0)} rows)" if counts.get("enabled") else "-"])
    return TableSpec("Prefix cache (prefix-on)", ["arm", "hits", "saved prompt tokens",
                                                  "row check"], rows, "lrrl")


def check_tables(report: dict[str, Any]) -> list[TableSpec]:
    """check.md's tables, in order; the same go to stdout."""
    tables = [sweeps_table(report), tokens_table(report), notes_table(report),
              divergences_table(report), rows_table(report), prefix_table(report)]
    return [table for table in tables if table is not None]


def _sampling_text() -> str:
    return ", ".join(f"{key} {value}" for key, value in SEEDED_SAMPLING.items())


def _intro(report: dict[str, Any], manifest: Manifest) -> str:
    roles, check, prompts = report["roles"], report["check"], report["prompts"]
    arms = ", ".join(f"{a.name} (`{a.spec}`)" for a in manifest.arms
                     if a.name != roles["yardstick"])
    launches = "; ".join(
        f"{name}: {_knobs_text(launch['knobs'])}"
        + (f", the heads also {_knobs_text(launch['head_knobs'])}"
           if launch.get("head_knobs") else "")
        for name, launch in report["launches"].items())
    return (f"Model {manifest.model} on {manifest.device}. Arms {arms}; the "
            f"yardstick {roles['yardstick']} is a second server of {roles['baseline']}. "
            f"{prompts['count']} prompts from `{prompts['path']}`, greedy (temperature 0; the "
            f"seeded sweep samples at {_sampling_text()}, each prompt's index its seed), "
            f"natural EOS, at most {check['max_tokens']} tokens each; top "
            f"{check['logprobs']} logprobs asked of servers that give them. One server per arm "
            f"and launch ({launches}); their logs are in logs/. Each divergence's top "
            "logprobs on both sides are in check.json, every answer in answers.jsonl.")


def servers_failed_text(report: dict[str, Any]) -> str:
    """The servers that failed to start, died or lost their engine core, one a line."""
    failed = report.get("servers_failed") or []
    return "\n".join(["## Servers that failed", "", *(f"- {line}" for line in failed)]) \
        if failed else ""


def check_md(report: dict[str, Any], manifest: Manifest) -> str:
    exit_code = 0 if report["verdict"] == "pass" else 1
    failed = servers_failed_text(report)
    return "\n\n".join([
        page_title(manifest, "check"), _intro(report, manifest),
        f"**Verdict: {report['verdict']}** (exit code {exit_code}; the check took "
        f"{report['wall_s']:.0f} s)", *([failed] if failed else []), time_line(manifest),
        "## The rule", report["rule"],
        *(table.md() for table in check_tables(report))]) + "\n"


def print_check(report: dict[str, Any], manifest: Manifest, fmt: OutputFormat) -> None:
    """A check on stdout as `fmt`: its verdict and tables, json (check.json's report) or md
    (check.md)."""
    render(fmt, lambda: report, lambda: check_md(report, manifest),
           lambda: check_tables(report), footer=f"verdict: {report['verdict']}")


def write_check(out: Path, report: dict[str, Any], manifest: Manifest,
                answers: dict[str, dict[str, list[Answer]]]) -> None:
    (out / CHECK_JSON).write_text(json.dumps(report, indent=2) + "\n")
    (out / CHECK_MD).write_text(check_md(report, manifest))
    with (out / ANSWERS_JSONL).open("w") as lines:
        for load, by_arm in answers.items():
            for arm, listed in by_arm.items():
                for prompt, answer in enumerate(listed):
                    lines.write(json.dumps({"load": load, "arm": arm, "prompt": prompt,
                                            **answer.to_dict()}) + "\n")
