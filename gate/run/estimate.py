"""How long a session will take, roughly, before it starts: from its cells, rounds, runs and
arms, on the CPU only (a GPU's speed varies too much between models to guess from a config).

The rates are the tiny model's on this project's 2-vCPU VM (results/2026-12-02-cpu-demo-short-runs:
200-320 output tok/s at c=1 with 16-token prompts, about 3.2 times that at c=4), slowed as the
context grows; the estimate is meant to tell minutes from hours, not to be exact.
"""

from __future__ import annotations

from gate.config import GateConfig

CPU_TOK_S = 250.0  # output tok/s of one slot, short context
CONCURRENCY_GAIN = 0.85  # tok/s grows as concurrency ** this, up to SATURATION slots
SATURATION = 16
CONTEXT_TOKENS = 256  # the context at which a token costs twice what it costs at none
PROMPT_COST = 1 / 16  # a prompt token's cost against an output token's
START_S = 2.5  # a tiny server's start on the CPU
LONG_S = 300.0  # an estimate above this gets a warning


def _run_seconds(config: GateConfig, concurrency: int, requests: int) -> float:
    prompt_len = config.shared_prefix_len + config.prompt_len
    tokens = requests * (config.output_len + PROMPT_COST * prompt_len)
    context = prompt_len + config.output_len / 2
    rate = CPU_TOK_S * min(concurrency, SATURATION) ** CONCURRENCY_GAIN
    return tokens * (1 + context / CONTEXT_TOKENS) / rate


def _timed_run_seconds(config: GateConfig, concurrency: int) -> float:
    """A measured run: open loop, it lasts at least until its last request arrives."""
    requests, rate = config.requests_for(concurrency), config.rate_for(concurrency)
    return max(_run_seconds(config, concurrency, requests), requests / rate if rate else 0.0)


def estimated_seconds(config: GateConfig, arms: int) -> float | None:
    """The session's rough wall time on the CPU (None on a GPU): every round starts each arm's
    server once, warms each cell (one request a slot) and times its runs."""
    if config.device != "cpu":
        return None
    cell_s = sum(_run_seconds(config, c, c) + config.runs * _timed_run_seconds(config, c)
                 for c in config.concurrency)
    return config.planned_rounds * arms * (START_S + cell_s)


def long_session_warning(config: GateConfig, arms: int) -> str | None:
    """One line when the session looks long (LONG_S), with the estimate and the way out."""
    seconds = estimated_seconds(config, arms)
    if seconds is None or seconds < LONG_S:
        return None
    cells = ",".join(map(str, config.concurrency))
    return (f"warning: this session looks long: about {seconds / 60:.0f} minutes on a quiet "
            f"2-core host ({config.planned_rounds} rounds x {arms} arms, cells c={cells}, "
            f"{config.prompt_len}/{config.output_len} prompt/output tokens on the CPU); "
            "configs/gate/demo-cpu.yaml shows a short CPU design (fewer cells, shorter prompts "
            "and outputs).")
