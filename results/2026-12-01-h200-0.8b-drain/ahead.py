"""GPU probe: varlen steps launched ahead vs in order on one engine (greedy tokens, bursts).
The script as it ran at f2b51d5 (README), formatted; from the tree's root:

    PYTHONPATH=$PWD:/tmp/site python3 results/2026-12-01-h200-0.8b-drain/ahead.py
"""

import dataclasses
import sys
import time

import torch

sys.path.insert(0, "tests")
from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.model.config import load_model_config
from resident.tools.bench import _burst_once

from model_driver import run_engine

dev = "cuda" if torch.cuda.is_available() else "cpu"
MODEL = load_model_config("qwen3.5-0.8b" if dev == "cuda" else "tiny")
BURST = (64, 512) if dev == "cuda" else (8, 64)
config = EngineConfig(
    kv_cache_gib=4.0, max_num_seqs=8, decode_buckets=(1, 2, 4, 8), max_model_len=4096
)
t = time.time()
engine = build_engine(MODEL, config, dev)
print("built", round(time.time() - t, 1), "s", flush=True)


def mode(m):
    engine.config = dataclasses.replace(engine.config, plan_ahead=m)


generator = torch.Generator().manual_seed(0)
lengths = torch.randint(8, 700, (32,), generator=generator).tolist()
prompts = {
    f"p{i}": (torch.randint(0, MODEL.vocab_size, (n,), generator=generator).tolist(), 24)
    for i, n in enumerate(lengths)
}
out = {}
for m in ("off", "launch"):
    mode(m)
    before = dict(engine.counters)
    out[m] = run_engine(engine, prompts, concurrency=None)
    ahead = {k: engine.counters[k] - before.get(k, 0) for k in engine.counters if "ahead" in k}
    print(m, "launched ahead", ahead, flush=True)
same = sum(out["off"][r] == out["launch"][r] for r in prompts)
print("greedy tokens launch vs off:", same, "/ 32 identical", flush=True)
for i, m in enumerate(("off", "launch", "off", "launch", "off", "launch")):
    mode(m)
    print(m, _burst_once(engine, f"b{i}", *BURST), flush=True)
