"""The check's verdict: each sweep judged from the servers' answers and row-check readings, by the
rule `verdict_rule` states (check.md prints it).

Token sweeps (greedy, concurrency, seeded, kv-pressure) compare every arm's tokens with the
baseline's, prompt by prompt; the yardstick, a second server of the baseline, measures how far
two servers of the same code already disagree. The rows sweep reads each server's
/debug/rowcheck under slot and KV pressure. The prefix sweep is three token loads (cache off, on
first pass, on again) judged alike, with each head's row check and prefix cache hits under
prefix-on. Everything here is pure: the session gathers, this judges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gate.check.config import PREFIX_LOADS, SWEEPS, CheckConfig
from gate.check.load import Answer

PASS, FAIL = "pass", "fail"
PRESSURES = ("slot-pressure", "kv-pressure")  # the rows sweep's readings, by launch


@dataclass(frozen=True)
class Roles:
    """The baseline, its second server (the yardstick) and the arms judged against it."""

    baseline: str
    yardstick: str
    heads: tuple[str, ...]

    @property
    def compared(self) -> tuple[str, ...]:
        """Every arm whose tokens are compared with the baseline's, the yardstick last."""
        return (*self.heads, self.yardstick)


def verdict_rule(check: CheckConfig, roles: Roles) -> str:
    """The rule, as check.md states it."""
    base = roles.baseline
    return "\n".join([
        "`pass` when every sweep holds, else `fail` (and the command exits 1):",
        "",
        "1. Every request to every server (the yardstick's too) answers HTTP 200 and finishes on "
        f"`stop` or `length` within its max_tokens ({check.max_tokens}; the concurrency and "
        "prefix loads cap prompt i at max_tokens - (i % 4) * max_tokens // 4, so rows leave "
        "out of order), and every server stays up to the end of its loads: one that failed to "
        "start, died, or whose engine core died (/health not 200) fails the check, named "
        "under *Servers that failed*.",
        f"2. greedy, concurrency, seeded, kv-pressure: each arm's tokens equal {base}'s on at "
        f"least as many prompts as the yardstick's ({base} against a second {base} server) do, "
        "or every prompt where they differ is a near-tie: at the first divergent token, each "
        "arm that reports logprobs there has both tokens among them with logprobs within "
        f"{check.near_tie:g} nats of each other, and at least one arm reports them.",
        "3. kv-pressure: every server offloaded at least once (a pool that never filled tested "
        "nothing).",
        "4. rows: every server that plans resident ran the row check on at least one step with 0 "
        "mismatches, with rows displaced under slot pressure and offloads under KV pressure; a "
        "host-planned server has no rows to check (n/a); and the tokens under slot pressure "
        "(under KV pressure too when the kv-pressure sweep is not run) hold as rule 2 says.",
        f"5. prefix: the loads {', '.join(PREFIX_LOADS)} each hold as rule 2 says (the heads "
        f"with the prefix cache on for the last two, {base} and the yardstick with their own "
        "knobs); "
        "each head hit the cache under prefix-on, and one that plans resident ran the row "
        "check with 0 mismatches.",
    ])


# -- tokens -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Divergence:
    """Where an arm's tokens for a prompt first differ from the baseline's, each side's token
    there (None: it had stopped) and each side's top logprobs there (None: not reported)."""

    prompt: int
    index: int
    baseline_token: int | None
    arm_token: int | None
    baseline_top: dict[int, float] | None
    arm_top: dict[int, float] | None
    near_tie: bool

    def to_dict(self) -> dict[str, Any]:
        def top(values: dict[int, float] | None) -> dict[str, float] | None:
            return None if values is None else {str(k): v for k, v in values.items()}

        return {"prompt": self.prompt, "index": self.index,
                "baseline_token": self.baseline_token, "arm_token": self.arm_token,
                "baseline_top": top(self.baseline_top), "arm_top": top(self.arm_top),
                "near_tie": self.near_tie}


def margin(top: dict[int, float] | None, own: int | None, rival: int | None) -> float | None:
    """own's logprob less rival's in one server's top logprobs; None unless both are there."""
    if top is None or own not in top or rival not in top:
        return None
    return top[own] - top[rival]


def is_near_tie(baseline_token: int | None, arm_token: int | None,
                tops: list[dict[int, float] | None], threshold: float) -> bool:
    reported = [top for top in tops if top is not None]
    if baseline_token is None or arm_token is None or not reported:
        return False
    margins = [margin(top, baseline_token, arm_token) for top in reported]
    return all(m is not None and abs(m) <= threshold for m in margins)


def _at(values: tuple, index: int) -> Any:
    return values[index] if index < len(values) else None


def first_divergence(prompt: int, baseline: Answer, arm: Answer,
                     threshold: float) -> Divergence | None:
    if baseline.token_ids == arm.token_ids:
        return None
    pairs = zip(baseline.token_ids, arm.token_ids, strict=False)
    index = next((i for i, (a, b) in enumerate(pairs) if a != b),
                 min(len(baseline.token_ids), len(arm.token_ids)))
    tokens = _at(baseline.token_ids, index), _at(arm.token_ids, index)
    tops = [_at(baseline.top, index), _at(arm.top, index)]
    return Divergence(prompt, index, *tokens, *tops,
                      near_tie=is_near_tie(*tokens, tops, threshold))


@dataclass(frozen=True)
class Agreement:
    """How many prompts an arm answered ok with the baseline's very tokens, of all prompts."""

    same: int
    total: int
    divergences: tuple[Divergence, ...]

    @property
    def far(self) -> list[Divergence]:
        """The divergences that are not near-ties."""
        return [d for d in self.divergences if not d.near_tie]


def compare(baseline: list[Answer], arm: list[Answer], threshold: float) -> Agreement:
    """Prompts where either side failed count as not the same (the failure is judged apart)."""
    both = [(i, b, a) for i, (b, a) in enumerate(zip(baseline, arm, strict=True))
            if b.ok and a.ok]
    divergences = tuple(d for i, b, a in both if (d := first_divergence(i, b, a, threshold)))
    return Agreement(len(both) - len(divergences), len(baseline), divergences)


def _failures(answers: dict[str, list[Answer]]) -> tuple[dict[str, int], list[str]]:
    """Failed requests per server, and a reason for each server with any."""
    failed = {arm: sum(not a.ok for a in listed) for arm, listed in answers.items()}
    reasons = [f"{arm}: {failed[arm]} of {len(listed)} requests failed "
               f"({next(a.error for a in listed if not a.ok)})"
               for arm, listed in answers.items() if failed[arm]]
    return failed, reasons


def noise_floor_note(yardstick: Agreement, baseline: str) -> str | None:
    """A note, not a reason: where the yardstick gives the baseline's tokens on under half the
    prompts, two servers of the same code already part on most of them (bf16 batches, random
    weights' close logits, sampling), so a head's count against it has little power either
    way: a pass does not clear the head and a fail does not convict it."""
    if 2 * yardstick.same >= yardstick.total:
        return None
    return (f"the yardstick gives {baseline}'s tokens on only {yardstick.same}/"
            f"{yardstick.total} prompts: two servers of the same code part on most prompts "
            "at this load, so its count says little either way (c=1, float32 or real weights "
            "give a load with more power)")


def judge_tokens(answers: dict[str, list[Answer]], roles: Roles,
                 check: CheckConfig) -> dict[str, Any]:
    """A token sweep: every request ok, and each head at least as close to the baseline as the
    yardstick is, or only near-ties apart. `notes` says where that count is weak."""
    failed, reasons = _failures(answers)
    base = answers[roles.baseline]
    agreements = {arm: compare(base, answers[arm], check.near_tie) for arm in roles.compared}
    yardstick = agreements[roles.yardstick]
    for head in roles.heads:
        mine = agreements[head]
        if mine.same < yardstick.same and mine.far:
            prompts = ", ".join(f"p{d.prompt}" for d in mine.far[:8])
            reasons.append(f"{head} gives {roles.baseline}'s tokens on {mine.same}/{mine.total} "
                           f"prompts, the yardstick on {yardstick.same}/{yardstick.total}, and "
                           f"{len(mine.far)} divergence(s) are not near-ties ({prompts})")
    note = noise_floor_note(yardstick, roles.baseline)
    return {"verdict": FAIL if reasons else PASS, "reasons": reasons, "failed": failed,
            "notes": [note] if note else [],
            "agreement": {arm: {"same": a.same, "total": a.total}
                          for arm, a in agreements.items()},
            "divergences": {arm: [d.to_dict() for d in a.divergences]
                            for arm, a in agreements.items()}}


# -- KV pressure and the row check ---------------------------------------------------------------


def _rowcheck(launched: dict[str, Any]) -> dict[str, Any]:
    return launched.get("rowcheck") or {}


def judge_kv_pressure(answers: dict[str, list[Answer]], launched: dict[str, dict[str, Any]],
                      roles: Roles, check: CheckConfig) -> dict[str, Any]:
    """The kv-pressure sweep: a token sweep whose servers must all have offloaded."""
    judged = judge_tokens(answers, roles, check)
    offloads = {arm: _rowcheck(launched.get(arm, {})).get("offloads", 0) for arm in answers}
    releases = {arm: _rowcheck(launched.get(arm, {})).get("slot_releases", 0)
                for arm in answers}
    idle = [arm for arm, count in offloads.items()
            if not count and not launched.get(arm, {}).get("error")]
    if idle:
        judged["reasons"].append(f"no offloads on {', '.join(idle)}: the KV pool "
                                 f"({', '.join(check.kv_pressure)}) never filled, so nothing "
                                 "was tested")
        judged["verdict"] = FAIL
    return {**judged, "offloads": offloads, "slot_releases": releases}


def row_reading(pressure: str, arm: str, launched: dict[str, Any],
                answers: list[Answer]) -> tuple[dict[str, Any], list[str]]:
    """One server's row check under one pressure: its counts, status (ok, n/a or fail) and the
    reasons it failed."""
    counts = _rowcheck(launched)
    failed, reasons = _failures({arm: answers})
    reading = {"planning_mode": launched.get("planning_mode"), "failed": failed[arm],
               **{key: counts.get(key, 0) for key in (
                   "steps", "rows", "mismatches", "displaced", "offloads", "slot_releases")}}
    if launched.get("error"):
        reasons.append(f"{arm} under {pressure}: {launched['error']}")
    elif launched.get("planning_mode") != "resident":
        return {**reading, "status": "fail" if reasons else "n/a"}, reasons
    elif not counts.get("enabled") or not counts.get("steps"):
        reasons.append(f"{arm} under {pressure}: the row check ran on no step")
    else:
        needed = "displaced" if pressure == "slot-pressure" else "offloads"
        if counts.get("mismatches"):
            reasons.append(f"{arm} under {pressure}: {counts['mismatches']} row mismatches over "
                           f"{counts['steps']} steps")
        reasons += _follower_mismatches(f"{arm} under {pressure}", counts)
        if not counts.get(needed):
            reasons.append(f"{arm} under {pressure}: nothing {needed}, so the pressure tested "
                           "nothing")
    return {**reading, "status": "fail" if reasons else "ok"}, reasons


def _follower_mismatches(where: str, counts: dict[str, Any]) -> list[str]:
    """A tensor-parallel server's row check on its other ranks (`ranks`, rank 0 first: its
    own counts are the top-level ones); each rank checks its own planner's rows."""
    return [f"{where}: rank {rank}: {each.get('mismatches', 0)} row mismatches over "
            f"{each.get('steps', 0)} steps"
            for rank, each in enumerate(counts.get("ranks") or []) if rank and (
                each.get("mismatches") or each.get("steps") != counts.get("steps"))]


def judge_rows(answers: dict[str, dict[str, list[Answer]]],
               launched: dict[str, dict[str, dict[str, Any]]], roles: Roles,
               check: CheckConfig) -> dict[str, Any]:
    """The rows sweep: every server's row check under slot and KV pressure, and the tokens
    under slot pressure against the baseline's (the yardstick beside: the row check compares
    the device's rows with the host's, so it cannot see a bug both share); the tokens under KV
    pressure too where the kv-pressure sweep does not judge them."""
    readings: dict[str, dict[str, Any]] = {}
    reasons: list[str] = []
    judged = [p for p in PRESSURES if p == "slot-pressure" or "kv-pressure" not in check.sweeps]
    tokens = {pressure: judge_tokens(answers[pressure], roles, check) for pressure in judged
              if roles.yardstick in answers.get(pressure, {})}
    reasons += [f"{pressure} tokens: {reason}" for pressure, sweep in tokens.items()
                for reason in sweep["reasons"]  # failed requests: in the readings below
                if "requests failed" not in reason]
    for pressure in PRESSURES:
        for arm, record in launched.get(pressure, {}).items():
            reading, why = row_reading(pressure, arm, record, answers[pressure][arm])
            readings.setdefault(pressure, {})[arm] = reading
            reasons += why
    return {"verdict": FAIL if reasons else PASS, "reasons": reasons, "readings": readings,
            "tokens": tokens}


def judge_prefix(answers: dict[str, dict[str, list[Answer]]],
                 launched: dict[str, dict[str, Any]], roles: Roles,
                 check: CheckConfig) -> dict[str, Any]:
    """The prefix sweep: its three loads judged as token sweeps; under prefix-on each head
    hit the cache (a cache that never hit tested nothing) and its row check found nothing."""
    loads = {load: judge_tokens(answers[load], roles, check) for load in PREFIX_LOADS}
    reasons = [f"{load}: {reason}" for load, judged in loads.items()
               for reason in judged["reasons"]]
    hits = {}
    for head in roles.heads:
        record = launched.get(head, {})
        if record.get("error"):
            continue  # its requests failed: judged above
        hits[head] = record.get("prefix_hits", 0)
        if not hits[head]:
            reasons.append(f"{head} never hit the prefix cache under prefix-on, so it tested "
                           "nothing")
        counts = _rowcheck(record)
        if record.get("planning_mode") == "resident" and (
                not counts.get("steps") or counts.get("mismatches")):
            reasons.append(f"{head} under prefix-on: {counts.get('mismatches', 0)} row "
                           f"mismatches over {counts.get('steps', 0)} steps")
    return {"verdict": FAIL if reasons else PASS, "reasons": reasons, "loads": loads,
            "hits": hits, "saved_tokens": {arm: launched.get(arm, {}).get(
                "prefix_saved_tokens", 0) for arm in roles.heads},
            "rowcheck": {arm: _rowcheck(launched.get(arm, {})) for arm in roles.heads}}


def judge(check: CheckConfig, roles: Roles, answers: dict[str, dict[str, list[Answer]]],
          launched: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Every chosen sweep's verdict and reasons, and the check's."""
    sweeps: dict[str, dict[str, Any]] = {}
    for sweep in (s for s in SWEEPS if s in check.sweeps):
        if sweep == "rows":
            sweeps[sweep] = judge_rows(answers, launched, roles, check)
        elif sweep == "kv-pressure":
            sweeps[sweep] = judge_kv_pressure(answers[sweep], launched[sweep], roles, check)
        elif sweep == "prefix":
            sweeps[sweep] = judge_prefix(answers, launched["prefix-on"], roles, check)
        else:
            sweeps[sweep] = judge_tokens(answers[sweep], roles, check)
    servers_failed = [f"{arm} under {launch}: {record['error']}"
                      for launch, by_arm in launched.items()
                      for arm, record in by_arm.items() if record.get("error")]
    verdict = PASS if all(s["verdict"] == PASS for s in sweeps.values()) \
        and not servers_failed else FAIL
    return {"verdict": verdict, "rule": verdict_rule(check, roles),
            "servers_failed": servers_failed,
            "roles": {"baseline": roles.baseline, "yardstick": roles.yardstick,
                      "heads": list(roles.heads)},
            "sweeps": sweeps}
