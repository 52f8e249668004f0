"""A served load, in process: up to N requests in flight on the engine, no HTTP, no API process.

    python -m resident.tools.closed_loop MODEL --prompts FILE --output-len 256
        --concurrency 64 [--device cpu|cuda] [--set knob=value ...] --json OUT

The in-process half of `python -m gate.tools.served_ratio`, which writes FILE (JSON:
{"warmup": [[token ids], ...], "measured": [[token ids], ...]}, the prompts its load client
sends, and for an open loop "arrivals": [seconds, ...], when it sends each measured one) and
runs this with the server's environment and CPUs. The engine is built as the engine core
builds it (server/core.py: build_core_engine, knobs from the model YAML, RESIDENT_* and --set
as `resident serve` takes them). Each prompt is one request of exactly --output-len tokens
(greedy, ignore_eos), added between steps, as the core takes in a request that arrived while a
step ran. A closed loop keeps --concurrency of them in flight, adding the next prompt as one
finishes. With arrivals, prompt i arrives arrivals[i] s after the run starts and is added at
the first step boundary after that with a slot free; its clock starts at its arrival if a slot
was free during the step it arrived in, else when the step that freed one ended (it waited, as
the load client's open loop counts: gate/run/load.py), and the loop idles until the next
arrival when nothing is in flight. The warm-up prompts run first as a closed loop, unmeasured.

OUT gets what the load client measures of a served request, per measured request (ok,
output_tokens, ttft_s, itl_s, latency_s, error: time from its send, as above, to each step that
emitted one of its tokens), how many waited for a slot (num_waited), the wall time from the
start to the last token, the engine's step
counters before and after (stats: steps and step_seconds by kind, generated_tokens, the prefix
cache's prefix_hits and prefix_cached_tokens) and
engine.info() (what /debug/config gives), so a caller can check it ran the served engine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from resident.config import build_engine_config, model_yaml_knobs, parse_set_options
from resident.engine.startup import StartupTimes
from resident.engine.types import EngineRequest, RequestOutput, SamplingParams
from resident.model.config import load_model_config
from resident.server.core import build_core_engine
from resident.tool_args import count

STEP_STATS = ("steps", "step_seconds", "generated_tokens", "prefix_hits", "prefix_cached_tokens")


@dataclass
class RequestTimes:
    """One request's clock: when it was added and when each of its tokens came out of a
    step; then the load client's RequestResult fields (gate/run/load.py), as a dict."""

    sent: float
    stamps: list[float] = field(default_factory=list)
    error: str | None = None

    def result(self, output_len: int) -> dict[str, Any]:
        tokens = len(self.stamps)
        if self.error is None and tokens != output_len:
            self.error = f"got {tokens} tokens, asked {output_len}"
        if self.error is not None:
            return {"ok": False, "output_tokens": tokens, "error": self.error}
        # to 0.1 µs: the file holds a gap a token, millions of them at c=256
        gaps = [round(b - a, 7) for a, b in zip(self.stamps, self.stamps[1:], strict=False)]
        return {"ok": True, "output_tokens": tokens, "ttft_s": self.stamps[0] - self.sent,
                "itl_s": gaps, "latency_s": self.stamps[-1] - self.sent}


@dataclass
class ClosedLoop:
    """The prompts of one run, kept `concurrency` in flight on `engine` (run)."""

    engine: Any  # resident.engine.engine.Engine
    prompts: list[list[int]]
    output_len: int
    concurrency: int
    tag: str  # request ids are tag-<prompt index>
    arrivals: list[float] | None = None  # open loop: prompt i's arrival, s after the start
    num_waited: int = field(init=False, default=0)  # open loop: arrived with every slot busy
    params: SamplingParams = field(init=False)
    waiting: deque[tuple[int, list[int]]] = field(init=False)
    live: dict[str, RequestTimes] = field(init=False, default_factory=dict)
    results: list[dict[str, Any]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.params = SamplingParams(max_tokens=self.output_len, ignore_eos=True)
        self.waiting = deque(enumerate(self.prompts))

    def run(self) -> float:
        """Every prompt to its last token; the wall seconds from the start to the last
        token. The results, in the order the requests finished, are in `results`."""
        self._started = time.perf_counter()
        self._fill(self._started, self.concurrency)
        while self.live or self.waiting:
            if not self.live:  # open loop, nothing in flight: idle until the next arrival
                time.sleep(max(0.0, self._due(self.waiting[0][0]) - time.perf_counter()))
                self._fill(time.perf_counter(), self.concurrency)
                continue
            if not self.engine.has_work():
                raise RuntimeError(f"the engine went idle with {len(self.live)} requests "
                                   "unfinished")
            spare = self.concurrency - len(self.live)  # slots free while the step runs
            outputs = self.engine.step()
            now = time.perf_counter()
            for output in outputs:
                self._take(output, now)
            self._fill(now, spare)
        return time.perf_counter() - self._started

    def _due(self, index: int) -> float:
        """When prompt `index` arrives (open loop), on the perf_counter clock."""
        return self._started + self.arrivals[index]

    def _fill(self, now: float, spare: int) -> None:
        """Adds the prompts that have arrived (all, in a closed loop) while a slot is free (a
        refused one fails alone). `spare`: the slots that were free during the last step, the
        first arrivals' since they came."""
        while self.waiting and len(self.live) < self.concurrency:
            index, prompt = self.waiting[0]
            if self.arrivals is None:
                sent = time.perf_counter()
            elif self._due(index) > now:
                return
            elif spare > 0:
                sent, spare = self._due(index), spare - 1
            else:  # every slot was busy when it came: it waited for the step that freed one
                sent = now
                self.num_waited += 1
            self.waiting.popleft()
            request_id = f"{self.tag}-{index}"
            times = RequestTimes(sent)
            refused = self.engine.add_request(EngineRequest(request_id, prompt, self.params))
            if refused is not None:
                times.error = refused.error or "refused"
                self.results.append(times.result(self.output_len))
            else:
                self.live[request_id] = times

    def _take(self, output: RequestOutput, now: float) -> None:
        times = self.live[output.request_id]
        times.stamps.extend([now] * len(output.new_token_ids))
        if output.finished:
            if output.error:
                times.error = output.error
            self.results.append(times.result(self.output_len))
            del self.live[output.request_id]


def step_stats(engine) -> dict[str, Any]:
    """The engine's step counters (STEP_STATS of engine.stats())."""
    stats = engine.stats()
    return {key: stats[key] for key in STEP_STATS}


def run(model: str, device: str, knobs: list[str], prompts: dict[str, list],
        output_len: int, concurrency: int) -> dict[str, Any]:
    """Builds the engine as the core does, runs the warm-up prompts, then the measured ones;
    what OUT holds (module docstring)."""
    model_config = load_model_config(model)
    config = build_engine_config(model_yaml_knobs(model), os.environ,
                                 parse_set_options(knobs)).resolve(model_config, device)
    engine = build_core_engine(model_config, config, device, StartupTimes())
    if prompts["warmup"]:
        ClosedLoop(engine, prompts["warmup"], output_len, concurrency, "warmup").run()
    before = step_stats(engine)
    loop = ClosedLoop(engine, prompts["measured"], output_len, concurrency, "measured",
                      prompts["arrivals"])
    wall_s = loop.run()
    return {"wall_s": wall_s, "requests": loop.results, "num_waited": loop.num_waited,
            "stats_before": before,
            "stats_after": step_stats(engine), "info": engine.info(),
            "params": asdict(loop.params)}


def _read_prompts(path: Path) -> dict[str, list]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not data.get("measured"):
        raise ValueError(f"{path}: expected {{\"warmup\": [...], \"measured\": [...]}} with "
                         "at least one measured prompt")
    arrivals = data.get("arrivals")
    if arrivals is not None and (len(arrivals) != len(data["measured"])
                                 or arrivals != sorted(arrivals) or arrivals[0] < 0):
        raise ValueError(f"{path}: \"arrivals\" must give each measured prompt a time in s, "
                         "from 0 up, in order")
    return {"warmup": data.get("warmup") or [], "measured": data["measured"],
            "arrivals": arrivals}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--prompts", type=Path, required=True,
                        help='JSON {"warmup": [[ids]], "measured": [[ids]]}')
    parser.add_argument("--output-len", type=count, default=256)
    parser.add_argument("--concurrency", type=count, default=64)
    parser.add_argument("--set", dest="knobs", action="append", default=[])
    parser.add_argument("--json", required=True, help="write the measurement here")
    args = parser.parse_args(argv)
    try:
        prompts = _read_prompts(args.prompts)
    except (OSError, ValueError) as err:
        parser.error(f"--prompts {args.prompts}: {err}")
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    result = run(args.model, args.device, args.knobs, prompts, args.output_len, args.concurrency)
    with open(args.json, "w") as handle:  # compact (no indent): a gap a token
        json.dump(result, handle, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
