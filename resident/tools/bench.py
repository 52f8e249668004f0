"""Decode step profile: where a decode step's time goes, in process, without the HTTP server.

    python -m resident.tools.bench MODEL [--concurrency 1,16,64,256] [--prompt-len 512]
                                   [--burst 64] [--set knob=value ...] [--json FILE]
                                   [--cprofile DIR] [--no-gc-freeze]
                                   [--temperature T] [--top-p P]

First the burst: N prompts (--burst) queued at once, each to its first token, run three times:
the first right after the engine is built (what a server's first users meet), then a steady
one, then one under torch.profiler. Each reports its wall time, prompt tokens/s and steps; the
profiled one the GPU kernel time of its prefill and mixed steps against their wall (GPU busy
share) and kernels per step.

For each concurrency c the engine takes c requests, prefills them, then runs decode steps with
all c rows, greedy, or drawn at --temperature and --top-p (each request seeded by its
index). It reports the wall time of a decode step (scheduling, host staging, the host
attention plan if any, the graph replay, sampling and its one sync), the GPU busy time inside
it (torch.profiler over PROFILED steps: the union of its kernels' intervals, and their count),
and the roofline of `resident info` at the same context (at the H200's copy bandwidth,
4.28 TB/s, on whatever GPU runs it: each row's `roofline_tb_s`). Step wall minus GPU busy
(`host gap`) is the device's idle in a step: launch gaps between kernels, inside a graph too,
and host time the GPU waits for. The bench's own garbage (the last concurrency's profiles and
requests) is collected before the timed steps; what the garbage collector runs inside them is
the engine's, in `gc ms` (its pauses a step, also in the host gap; the JSON's
`gc_collections` counts them by generation).
It also times the prefill of the c prompts (`prefill_ms`, first-use compiles included), and,
warm, one fresh prompt alone to its first token: wall (`fresh_prefill_ms`, the TTFT at c=1
without the server) and its GPU kernel time (`fresh_prefill_gpu_ms`); the difference is host
time the prefill makes the GPU wait for.

With --cprofile DIR, once the timed steps are done, it runs decode steps and then one fresh
prompt's prefill under cProfile and writes the costliest Python functions of each to
DIR/decode_c{c}.txt and DIR/prefill_c{c}.txt: where the host time of a step goes.

Last, a line for each Triton kernel specialization compiled in the run: its warps, stages,
registers, spill and shared bytes as loaded (compiled_kernels.py).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import io
import json
import pstats
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from resident.config import build_engine_config, model_yaml_knobs, parse_set_options
from resident.engine.engine import Engine, build_engine
from resident.engine.types import EngineRequest, SamplingParams
from resident.heap import GcPauses, freeze_heap, set_young_threshold
from resident.info import model_facts
from resident.model.config import load_model_config
from resident.profiling.summary import frontier_shares
from resident.tool_args import add_draw, counts
from resident.tools.bench_io import require_cuda, write_json
from resident.tools.compiled_kernels import compiled_kernels

TIMED, PROFILED, TOP_KERNELS = 40, 10, 14


@dataclasses.dataclass(frozen=True)
class Draw:
    """How the decode rows draw their tokens (--temperature, --top-p)."""

    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        SamplingParams(max_tokens=1, temperature=self.temperature, top_p=self.top_p)


GREEDY = Draw()


def _decode_steps(engine: Engine, count: int) -> float:
    """Seconds per decode step over `count` steps (each ends in sampling's sync)."""
    start = time.perf_counter()
    for _ in range(count):
        engine.step()
    return (time.perf_counter() - start) / count


def _kernel_profile(run, count: int | Callable[[], int]) -> tuple[float, float, list[dict]]:
    """(GPU busy ms, kernels, the TOP_KERNELS costliest kernel names) per one of the `count`
    units of work (steps) `run` does, from torch.profiler; `count` may be read after `run`.
    Busy is the union of the kernels' intervals (summary.union_us): under PDL their durations
    overlap, and each kernel's own µs in the top rows include its wait for the one before;
    its `exposed_us_per_step` is its share of busy (summary.frontier_shares), which add up."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    if callable(count):
        count = count()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    shares = frontier_shares([(e.time_range.start, e.time_range.end) for e in kernels])
    by_name: dict[str, list[float]] = {}
    exposed: dict[str, float] = {}
    for event, share in zip(kernels, shares, strict=True):
        by_name.setdefault(event.name, []).append(event.device_time_total)
        exposed[event.name] = exposed.get(event.name, 0.0) + share
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:TOP_KERNELS]
    top_rows = [{"kernel": name[:90], "us_per_step": round(sum(times) / count, 1),
                 "exposed_us_per_step": round(exposed[name] / count, 1),
                 "calls_per_step": len(times) / count} for name, times in top]
    return sum(shares) / 1e3 / count, len(kernels) / count, top_rows


def _fresh_prefill_s(engine: Engine, prompt_len: int, tag: str) -> float:
    """Seconds for one fresh prompt, alone, to its first token."""
    _add_prompts(engine, tag, 1, prompt_len, 1)
    seconds, _ = _prefill(engine)
    _abort_all(engine)
    return seconds


def _add_prompts(engine: Engine, tag: str, count: int, prompt_len: int, max_tokens: int,
                 draw: Draw = GREEDY) -> None:
    """`count` random prompts, seeded by `tag`: a tag used once gives prompts the engine has not
    seen, so the prefix cache (on by default) neither restores nor cuts them. Each draws its
    tokens as `draw` says, seeded by its index."""
    generator = torch.Generator().manual_seed(zlib.crc32(tag.encode()))
    for index in range(count):
        prompt = torch.randint(0, engine.model_config.vocab_size, (prompt_len,),
                               generator=generator).tolist()
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                temperature=draw.temperature, top_p=draw.top_p, seed=index)
        engine.add_request(EngineRequest(f"{tag}-{index}", prompt, params))


def _prefill(engine: Engine) -> tuple[float, int]:
    """(seconds, steps that ran rows) until every request has its prompt computed."""
    start, steps_before = time.perf_counter(), _steps_run(engine)
    while engine.scheduler.waiting or any(r.num_computed < len(r.prompt_ids)
                                          for r in engine.requests.values()):
        engine.step()
    return time.perf_counter() - start, _steps_run(engine) - steps_before


def _steps_run(engine: Engine) -> int:
    return sum(engine.stats()["steps"].values())


def _write_cprofile(profiler: cProfile.Profile, path: Path) -> None:
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    path.write_text(text.getvalue())


def _cprofile_steps(engine: Engine, concurrency: int, prompt_len: int, out: Path) -> None:
    """Decode steps, then (the batch aborted) one fresh prompt's prefill, under cProfile."""
    profiler = cProfile.Profile()
    profiler.runcall(_decode_steps, engine, TIMED)
    _write_cprofile(profiler, out / f"decode_c{concurrency}.txt")
    _abort_all(engine)
    profiler = cProfile.Profile()
    profiler.runcall(_fresh_prefill_s, engine, prompt_len, f"fresh-c{concurrency}-cprofile")
    _write_cprofile(profiler, out / f"prefill_c{concurrency}.txt")


def _abort_all(engine: Engine) -> None:
    for request_id in list(engine.requests):
        engine.abort(request_id)


def profile_concurrency(engine: Engine, concurrency: int, prompt_len: int,
                        cprofile_dir: Path | None = None, draw: Draw = GREEDY) -> dict:
    """The decode rows of `concurrency` requests that draw as `draw` says (module docstring)."""
    steps = 3 * (TIMED + PROFILED) + 16
    _add_prompts(engine, f"c{concurrency}", concurrency, prompt_len, steps, draw)
    prefill_s, prefill_steps = _prefill(engine)
    _decode_steps(engine, 8)  # warm
    # what the earlier concurrencies left (their profiles, their requests): in one H100 call a
    # full collection fell inside c=256's timed steps, the last of six, in 8 of 9 runs (~40 ms,
    # ~1 ms a step), never inside c=128's (results/2026-12-07-h100-conv-programs)
    gc.collect()
    before = dict(engine.counters)
    with GcPauses() as pauses:
        step_s = _decode_steps(engine, TIMED)
    decode_steps = engine.counters["steps_decode"] - before.get("steps_decode", 0)
    gpu_ms, kernels, top = _kernel_profile(lambda: _decode_steps(engine, PROFILED), PROFILED)
    if cprofile_dir is not None:
        _cprofile_steps(engine, concurrency, prompt_len, cprofile_dir)
    _abort_all(engine)
    fresh_s = _fresh_prefill_s(engine, prompt_len, f"fresh-c{concurrency}")
    fresh_gpu_ms, fresh_kernels, _ = _kernel_profile(
        lambda: _fresh_prefill_s(engine, prompt_len, f"fresh-c{concurrency}-profiled"), 1)
    context = prompt_len + 8 + TIMED
    facts = model_facts(engine.model_config, context=context, batches=(concurrency,),
                        state_bytes=engine.cache.recurrent.element_size())
    roofline = facts.roofline[0]
    return {
        "concurrency": concurrency, "decode_steps_timed": decode_steps,
        "step_ms": round(step_s * 1e3, 3), "tok_s": round(concurrency / step_s, 1),
        "gpu_busy_ms": round(gpu_ms, 3), "kernels_per_step": round(kernels, 1),
        "host_gap_ms": round(step_s * 1e3 - gpu_ms, 3),
        "gc_ms_per_step": round(pauses.seconds * 1e3 / TIMED, 3),
        "gc_collections": pauses.stats()["gc_collections"],
        "roofline_ms": round(roofline.ms_per_step, 3), "roofline_tb_s": facts.bandwidth_tb_s,
        "context": context,
        "prefill_ms": round(prefill_s * 1e3, 2), "prefill_steps": prefill_steps,
        "fresh_prefill_ms": round(fresh_s * 1e3, 2),
        "fresh_prefill_gpu_ms": round(fresh_gpu_ms, 2), "fresh_prefill_kernels": fresh_kernels,
        "top_kernels": top,
    }


def _burst_once(engine: Engine, tag: str, count: int, prompt_len: int) -> dict:
    _add_prompts(engine, tag, count, prompt_len, 1)  # each finishes on its first token
    torch.cuda.synchronize()
    seconds, steps = _prefill(engine)
    while engine.has_work():  # the step planned ahead, if any, and the last emits
        engine.step()
    torch.cuda.synchronize()
    return {"wall_ms": round(seconds * 1e3, 1), "steps": steps,
            "ms_per_step": round(seconds * 1e3 / steps, 2),
            "prompt_tok_s": round(count * prompt_len / seconds)}


def burst_rows(engine: Engine, count: int, prompt_len: int) -> dict:
    """The first burst after the build, a steady one, and a profiled one (module docstring)."""
    first = _burst_once(engine, "burst-first", count, prompt_len)
    steady = _burst_once(engine, "burst-steady", count, prompt_len)
    profiled: dict = {}

    def run() -> None:
        profiled.update(_burst_once(engine, "burst-profiled", count, prompt_len))

    step_gpu_ms, step_kernels, top = _kernel_profile(run, lambda: profiled["steps"])
    gpu_ms = step_gpu_ms * profiled["steps"]
    return {"prompts": count, "prompt_len": prompt_len, "first": first, "steady": steady,
            "first_over_steady": round(first["wall_ms"] / steady["wall_ms"], 2),
            "profiled_wall_ms": profiled["wall_ms"], "gpu_busy_ms": round(gpu_ms, 1),
            "gpu_busy_share": round(gpu_ms / profiled["wall_ms"], 3),
            "kernels_per_step": round(step_kernels, 1), "top_kernels": top}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--concurrency", type=counts, default="1,16,64,256")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--burst", type=int, default=64, help="prompts in the burst (0: none)")
    parser.add_argument("--set", dest="knobs", action="append", default=[])
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--cprofile", type=Path, help="write Python profiles of steps here")
    add_draw(parser)
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="leave the startup heap to the garbage collector and its young "
                             "generation at Python's threshold (the engine core freezes the "
                             "one and raises the other), to measure what they save")
    args = parser.parse_args(argv)
    try:
        draw = Draw(args.temperature, args.top_p)
    except ValueError as err:
        parser.error(str(err))
    if not require_cuda("resident.tools.bench"):
        return 2
    model = load_model_config(args.model)
    config = build_engine_config(model_yaml_knobs(args.model), None,
                                 parse_set_options(args.knobs))
    engine = build_engine(model, config, "cuda")
    if not args.no_gc_freeze:  # as the engine core does
        freeze_heap()
        set_young_threshold(config.gc_young_threshold)
    if args.cprofile:
        args.cprofile.mkdir(parents=True, exist_ok=True)
    burst = burst_rows(engine, args.burst, args.prompt_len) if args.burst else None
    rows = [profile_concurrency(engine, c, args.prompt_len, args.cprofile, draw)
            for c in args.concurrency]
    knobs = {k: engine.config.to_dict()[k] for k in
             ("attention_backend", "decode_gemm", "gemv_table", "fused_decode", "pdl",
              "decode_splits", "gdn_state_dtype", "cuda_graphs", "compile",
              "resident_planning", "padded_prefill", "prefill_token_budget", "sampler")}
    knobs |= {"temperature": draw.temperature, "top_p": draw.top_p}
    print(json.dumps(knobs))
    if burst:
        print(json.dumps({k: v for k, v in burst.items() if k != "top_kernels"}))
    header = ("c", "step ms", "tok/s", "gpu ms", "kernels", "host gap ms", "gc ms",
              "roofline ms", "prefill ms", "gpu ms")
    print(" ".join(f"{h:>11}" for h in header))
    for row in rows:
        values = (row["concurrency"], row["step_ms"], row["tok_s"], row["gpu_busy_ms"],
                  row["kernels_per_step"], row["host_gap_ms"], row["gc_ms_per_step"],
                  row["roofline_ms"], row["fresh_prefill_ms"], row["fresh_prefill_gpu_ms"])
        print(" ".join(f"{v:>11}" for v in values))
    compiled = compiled_kernels()
    for kernel in compiled:
        print(json.dumps(kernel))
    write_json(args.json, {"knobs": knobs, "burst": burst, "rows": rows,
                           "compiled_kernels": compiled})
    return 0


if __name__ == "__main__":
    sys.exit(main())
