"""Model configs and engine knobs: precedence, and a bad value fails naming it."""

from __future__ import annotations

import pytest

from resident.config import (
    EngineConfig,
    _resolve_sampler,
    build_engine_config,
    env_name,
    model_yaml_knobs,
    parse_set_options,
)
from resident.model.config import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    configs_dir,
    load_model_config,
    shipped_model_names,
)
from resident.server.core import step_cores, torch_threads


def test_shipped_configs_have_the_real_structure():
    assert shipped_model_names() == [
        "qwen3.5-0.8b", "qwen3.5-27b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b", "tiny"]
    for name in shipped_model_names():
        config = load_model_config(name)
        assert config.weights == "random"
        for i, kind in enumerate(config.layer_types):
            assert kind == (FULL_ATTENTION if (i + 1) % 4 == 0 else LINEAR_ATTENTION)
        assert config.rotary_dim == config.head_dim // 4


def test_tiny_fits_the_gate_cells():
    tiny = load_model_config("tiny")
    assert tiny.vocab_size >= 512 and tiny.max_position_embeddings >= 2048
    assert tiny.tie_word_embeddings
    assert tiny.linear_num_value_heads > tiny.linear_num_key_heads
    assert tiny.num_attention_heads > tiny.num_key_value_heads


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 0}, "hidden_size must be a positive int"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
        ({"linear_num_key_heads": 3}, "not a multiple of linear_num_key_heads"),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor must be in"),
        ({"head_dim": 36}, "rotary dims"),
        ({"layer_types": ("full_attention",) * 8 + ("mamba",)}, "layer_types has 9 entries"),
        ({"layer_types": ("mamba",) * 8}, "unknown layer type 'mamba'"),
        ({"weights": "/no/such/dir"}, "weights must be 'random' or a checkpoint directory"),
    ],
)
def test_bad_values_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        load_model_config("tiny").replace(**change)


def test_yaml_with_unknown_field(tmp_path):
    path = tmp_path / "odd.yaml"
    path.write_text((configs_dir() / "models" / "tiny.yaml").read_text() + "hiden_size: 3\n")
    with pytest.raises(ValueError, match="unknown model field 'hiden_size'"):
        load_model_config(str(path))


# -- engine knobs -----------------------------------------------------------------------------



def test_knob_precedence_defaults_yaml_env_set(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text((configs_dir() / "models" / "tiny.yaml").read_text()
                    + "engine:\n  page_size: 8\n  max_num_seqs: 7\n  decode_order: turns\n")
    assert load_model_config(str(path)).name == "m"  # the engine mapping is not a model field
    yaml_knobs = model_yaml_knobs(str(path))
    env = {"RESIDENT_MAX_NUM_SEQS": "9", "RESIDENT_PLANNING": "off", "RESIDENT_DECODE_ORDER":
           "arrival"}
    config = build_engine_config(yaml_knobs, env, parse_set_options(["decode_order=turns",
                                                                      "decode_buckets=1,2,4"]))
    assert config.page_size == 8  # YAML over the default
    assert config.max_num_seqs == 9  # environment over YAML
    assert config.resident_planning == "off"  # one prefix for resident_* knobs
    assert config.decode_order == "turns"  # --set over the environment
    assert config.decode_buckets == (1, 2, 4)
    assert config.prefill_token_budget == EngineConfig().prefill_token_budget
    assert build_engine_config({}, {}, {}) == EngineConfig()


def test_env_names():
    assert env_name("resident_planning") == "RESIDENT_PLANNING"
    assert env_name("page_size") == "RESIDENT_PAGE_SIZE"


@pytest.mark.parametrize(
    "yaml_knobs, env, overrides, message",
    [
        ({"page_sise": 8}, {}, {}, "unknown knob 'page_sise' (from model YAML engine)"),
        ({}, {}, {"nope": "1"}, "unknown knob 'nope' (from --set)"),
        ({}, {"RESIDENT_PAGE_SIZE": "big"}, {}, "knob page_size: 'big' is not a valid int"),
        ({}, {}, {"page_size": "12"}, "knob page_size: must be a power of two"),
        ({}, {}, {"decode_buckets": "4,2"}, "knob decode_buckets: must be increasing"),
        ({}, {}, {"resident_planning": "on"}, "knob resident_planning: 'on' is not one of"),
        ({}, {}, {"api_core": "a-b"}, "knob api_core: 'a-b' is not a CPU list"),
        ({}, {}, {"api_core": "auto"}, "knob api_core: 'auto' is not a CPU list"),
        ({}, {}, {"step_thread_cores": "autox"},
         "knob step_thread_cores: 'autox' is not a CPU list"),
        ({}, {}, {"plan_ahead": "auto"}, "knob plan_ahead: 'auto' is not one of"),
        ({}, {}, {"num_kv_pages": "1"}, "knob num_kv_pages: needs at least 2"),
    ],
)
def test_bad_knobs_are_named(yaml_knobs, env, overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_engine_config(yaml_knobs, env, overrides)


def test_set_option_needs_an_equals_sign():
    with pytest.raises(ValueError, match="--set 'page_size': expected knob=value"):
        parse_set_options(["page_size"])


def test_resolve_sizes_the_auto_knobs():
    tiny = load_model_config("tiny")
    resolved = EngineConfig(max_num_seqs=10).resolve(tiny, "cpu")
    assert (resolved.max_model_len, resolved.num_kv_pages, resolved.num_state_slots) == (
        4096, 4096, 11)
    # on CUDA from kv_cache_gib: K and V of the 2 attention layers, 16 tokens a page, bf16
    per_page = 2 * 2 * 16 * tiny.num_key_value_heads * tiny.head_dim * 2
    cuda = EngineConfig(kv_cache_gib=0.5).resolve(tiny, "cuda")
    assert cuda.num_kv_pages == 2**29 // per_page and cuda.dtype == "bfloat16"
    assert cuda.is_resolved and not EngineConfig().is_resolved
    assert cuda.resolve(tiny, "cuda") == cuda  # resolving twice changes nothing
    # a tensor-parallel rank's page holds half the KV heads: twice the pages in the same GiB
    split = EngineConfig(kv_cache_gib=0.5, tensor_parallel=2).resolve(tiny, "cuda")
    assert split.num_kv_pages == 2 * cuda.num_kv_pages
    with pytest.raises(ValueError, match="max_model_len: 5000 exceeds"):
        EngineConfig(max_model_len=5000).resolve(tiny, "cpu")
    with pytest.raises(ValueError, match="kv_cache_gib"):
        EngineConfig(kv_cache_gib=1e-9).resolve(tiny, "cuda")


@pytest.mark.parametrize("knobs, allowed, cores", [
    ({"step_thread_cores": "auto", "api_core": "3"}, [0, 1, 2, 3], [0, 1]),
    ({"step_thread_cores": "auto", "api_core": "0"}, [0, 1, 2, 3], [1, 2]),
    ({"step_thread_cores": "auto", "api_core": "1"}, [0, 1], [0, 1]),  # too few left: all
    ({"step_thread_cores": "2-3"}, [0, 1, 2, 3], [2, 3]),
    ({}, [0, 1], []),
])
def test_step_thread_cores(knobs, allowed, cores):
    assert step_cores(EngineConfig(**knobs), allowed) == cores


@pytest.mark.parametrize("api_core, device, allowed, threads", [
    ("", "cpu", [0, 1], 1),  # the API process and the client share the two CPUs
    ("", "cpu", [0], 1),
    ("", "cpu", list(range(8)), 7),
    ("3", "cpu", [0, 1, 2, 3], 3),  # the API process on a CPU of its own
    ("7", "cpu", [1, 2], 2),  # ... outside the step cores
    ("0-1", "cpu", [0, 1], 1),
    ("", "cuda", list(range(16)), 2),
    ("", "cuda", [0], 1),
])
def test_torch_threads_leave_the_api_process_a_cpu(api_core, device, allowed, threads):
    assert torch_threads(EngineConfig(api_core=api_core), device, allowed) == threads


@pytest.mark.parametrize("knob, device_type, resolved", [
    ("auto", "cuda", "triton"), ("auto", "cpu", "torch"), ("torch", "cuda", "torch"),
    ("triton", "cuda", "triton")])
def test_the_sampler_knob_resolves_to_the_race_kernel_on_cuda_and_torch_elsewhere(
        knob, device_type, resolved):
    assert _resolve_sampler(knob, device_type) == resolved


@pytest.mark.parametrize("knob", ["flashinfer", "triton"])
def test_the_kernel_samplers_need_cuda(knob):
    with pytest.raises(ValueError, match=f"knob sampler: {knob} needs a CUDA device"):
        _resolve_sampler(knob, "cpu")
