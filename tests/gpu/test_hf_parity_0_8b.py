"""qwen3.5-0.8b random weights in bf16 on the GPU against transformers with the same weights.

Four prompts of 512 random tokens, 16 decode steps, teacher-forced on an fp32 transformers run's
greedy tokens: our bf16 logits stray from fp32 no more than transformers' own bf16 run does (with
a little slack), and both runs' argmax agreement with fp32 is printed, with each of our flips and
its fp32 top-2 margin.
"""

from __future__ import annotations

import time

import pytest
import torch

from resident.model.config import load_model_config
from resident.model.weights import load_model

from model_driver import ModelDriver

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")

NUM_PROMPTS, PROMPT_LEN, NUM_STEPS = 4, 512, 16
# Ours in bf16 may stray from an fp32 reference no more than transformers' own bf16 run does
# (with a little slack); a wrong op strays by ~1.
SLACK = 1.5


def _reference_from(ours, dtype):
    config = ours.config
    hf_config = transformers.Qwen3_5TextConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
        linear_num_key_heads=config.linear_num_key_heads,
        linear_num_value_heads=config.linear_num_value_heads,
        linear_key_head_dim=config.linear_key_head_dim,
        linear_value_head_dim=config.linear_value_head_dim,
        tie_word_embeddings=config.tie_word_embeddings, layer_types=list(config.layer_types),
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta,
                         "partial_rotary_factor": config.partial_rotary_factor},
    )
    hf_config._attn_implementation = "sdpa"
    with torch.device("meta"):
        reference = transformers.Qwen3_5ForCausalLM(hf_config)
    state = dict(ours.named_parameters())
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    state = {name: tensor.to(dtype) for name, tensor in state.items()}
    reference.load_state_dict(state, strict=True, assign=True)
    reference.model.rotary_emb.inv_freq = ours.inv_freq.clone()
    reference.model.rotary_emb.original_inv_freq = ours.inv_freq.clone()
    return reference.eval()


def test_qwen3_5_0_8b_bf16_against_transformers():
    config = load_model_config("qwen3.5-0.8b")
    start = time.perf_counter()
    ours = load_model(config, "cuda", torch.bfloat16)
    torch.cuda.synchronize()
    print(f"\nrandom 0.8B built in {time.perf_counter() - start:.1f} s")
    exact = _reference_from(ours, torch.float32)  # the yardstick
    reference = _reference_from(ours, torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config.vocab_size, (PROMPT_LEN,), generator=generator).tolist()
               for _ in range(NUM_PROMPTS)]

    driver = ModelDriver(ours, num_pages=NUM_PROMPTS * 40 + 1, num_slots=NUM_PROMPTS + 1,
                         device="cuda")
    logits = driver.step({i: p for i, p in enumerate(prompts)})
    contexts = [list(p) for p in prompts]
    agree, agree_hf, worst_rel, worst_rel_hf, flips = 0, 0, 0.0, 0.0, []
    for step in range(NUM_STEPS):
        forced = {}
        for i, context in enumerate(contexts):
            with torch.no_grad():
                ids = torch.tensor([context], device="cuda")
                truth = exact(ids).logits[0, -1].float()
                theirs = reference(ids).logits[0, -1].float()
            got = logits[i][-1].float()
            worst_rel = max(worst_rel, ((got - truth).norm() / truth.norm()).item())
            worst_rel_hf = max(worst_rel_hf, ((theirs - truth).norm() / truth.norm()).item())
            top2 = truth.topk(2)
            token = int(top2.indices[0])
            agree_hf += int(theirs.argmax()) == token
            if int(got.argmax()) == token:
                agree += 1
            else:
                margin = (top2.values[0] - top2.values[1]).item()
                flips.append(f"prompt {i} step {step}: flip, fp32 top-2 margin {margin:.3f}")
            forced[i] = token
            context.append(token)
        logits = driver.step({i: [t] for i, t in forced.items()})
    total = NUM_PROMPTS * NUM_STEPS
    print(f"teacher-forced on fp32 greedy: ours bf16 agrees {agree}/{total}, transformers bf16 "
          f"{agree_hf}/{total}; max relative logit error vs fp32: ours {worst_rel:.2e}, "
          f"transformers {worst_rel_hf:.2e}")
    print("\n".join(flips))
    assert worst_rel <= SLACK * worst_rel_hf
