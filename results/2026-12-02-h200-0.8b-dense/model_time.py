"""Where load_model's seconds go on the GPU: each of its steps synchronised, twice in one
process (the second shows what is a first-use cost)."""
import time

import torch

from resident.model import weights as W
from resident.model.config import load_model_config
from resident.model.qwen3_5 import Qwen3_5ForCausalLM

config = load_model_config("qwen3.5-0.8b")
last = time.perf_counter()


def lap(name):
    global last
    torch.cuda.synchronize()
    now = time.perf_counter()
    print(f"{name}: {now - last:.3f} s", flush=True)
    last = now


torch.empty(1, device="cuda")
lap("context")
for attempt in range(2):
    print("attempt", attempt)
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(config).to(torch.bfloat16)
    lap("meta build")
    model = model.to_empty(device="cuda")
    lap("to_empty")
    model.init_buffers()
    lap("init_buffers")
    params = dict(model.named_parameters())
    print("params", len(params))
    W._fill_random(params, config.seed)
    lap("fill_random")
    model.requires_grad_(False)
    model.fuse_projections()
    lap("fuse")
    W.weights_fingerprint(model)
    lap("fingerprint")
    del model, params
    torch.cuda.empty_cache()
