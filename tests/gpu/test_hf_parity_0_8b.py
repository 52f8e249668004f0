"""qwen3.5-0.8b random weights in bf16 on the GPU against transformers with the same weights.

Four prompts of 512 random tokens, 16 decode steps, teacher-forced on the reference's greedy
tokens: every step's logits within bf16's relative error of the reference, and the argmax the
same on at least 90% of steps (each flip is printed with the reference's top-2 margin).
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
MAX_RELATIVE_ERROR = 2e-2  # bf16 operands land between 1e-3 and 1e-2; a wrong op lands near 1
MIN_AGREEMENT = 0.9  # teacher-forced argmax; the rest must be near-ties, reported by margin


def _reference_from(ours):
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
    reference = _reference_from(ours)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config.vocab_size, (PROMPT_LEN,), generator=generator).tolist()
               for _ in range(NUM_PROMPTS)]

    driver = ModelDriver(ours, num_pages=NUM_PROMPTS * 40 + 1, num_slots=NUM_PROMPTS + 1,
                         device="cuda")
    logits = driver.step({i: p for i, p in enumerate(prompts)})
    contexts = [list(p) for p in prompts]
    agree, worst_abs, worst_rel, flips = 0, 0.0, 0.0, []
    first_divergence = {i: None for i in range(NUM_PROMPTS)}
    for step in range(NUM_STEPS):
        forced = {}
        for i, context in enumerate(contexts):
            with torch.no_grad():
                expected = reference(torch.tensor([context], device="cuda")).logits[0, -1].float()
            got = logits[i][-1].float()
            worst_abs = max(worst_abs, (got - expected).abs().max().item())
            worst_rel = max(worst_rel, ((got - expected).norm() / expected.norm()).item())
            top2 = expected.topk(2)
            ref_token = int(top2.indices[0])
            if int(got.argmax()) == ref_token:
                agree += 1
            else:
                margin = (top2.values[0] - top2.values[1]).item()
                flips.append(f"prompt {i} step {step}: flip, reference top-2 margin {margin:.3f}")
                if first_divergence[i] is None:
                    first_divergence[i] = step
            forced[i] = ref_token
            context.append(ref_token)
        logits = driver.step({i: [t] for i, t in forced.items()})
    total = NUM_PROMPTS * NUM_STEPS
    print(f"teacher-forced greedy agreement {agree}/{total}; max abs logit diff {worst_abs:.3f}; "
          f"max relative error {worst_rel:.2e}")
    print(f"first divergence per prompt: {first_divergence}")
    print("\n".join(flips))
    assert worst_rel < MAX_RELATIVE_ERROR
    assert agree >= MIN_AGREEMENT * total
