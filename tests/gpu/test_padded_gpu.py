"""Padded prefill and mixed steps on the GPU (issue 18): the kernels at the 0.8B shapes against
the references, the fla part fed a fixed chunk table inside a captured graph, and the engine's
greedy tokens with graphs on and off through every bucket with decode rows riding along."""

from __future__ import annotations

import pytest
import torch

from resident.backends.padded import fla_sequences, split_gdn_op, triton_decode_rows
from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.kernels.attention import paged_attention_ref
from resident.kernels.gdc import KeptZeros
from resident.kernels.gdn import gated_delta_rule_ref, l2norm
from resident.kernels.varlen_attention import paged_varlen_attention
from resident.model.config import load_model_config
from resident.model.dense import gdn_gates
from resident.model.step import GDN_CHUNK, GdnSplit, StepMeta, chunk_table

from model_driver import run_engine

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")
PAGE = 16


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_varlen_attention_matches_the_reference_at_the_08b_shapes(num_splits):
    """Rows of 1 (decode), 512 fresh, 37 over 600 stored, 1 over 2046 stored; zero-length
    padding rows and padding tokens; one program a query block, and its keys split
    (varlen_splits=auto), merged by the last split in the kernel."""
    generator = torch.Generator().manual_seed(0)
    rows = [(40, 1), (0, 512), (600, 37), (2046, 1)]
    counts = [-(-(c + n) // PAGE) for c, n in rows]
    num_pages = sum(counts) + 4
    order = (torch.randperm(num_pages - 1, generator=generator) + 1).tolist()
    tables = torch.zeros(len(rows) + 3, max(counts), dtype=torch.int32)
    positions, token_seq, qsl = [], [], [0]
    for index, ((context, new), count) in enumerate(zip(rows, counts, strict=True)):
        tables[index, :count] = torch.tensor([order.pop() for _ in range(count)])
        positions += range(context, context + new)
        token_seq += [index] * new
        qsl.append(qsl[-1] + new)
    real = qsl[-1]
    qsl += [real] * 3
    positions += [0] * 29
    kv = torch.randn(num_pages, 2, PAGE, 2, 256, generator=generator).to(DEVICE, torch.bfloat16)
    query = torch.randn(len(positions), 8, 256, generator=generator).to(DEVICE, torch.bfloat16)
    tables, qsl = tables.to(DEVICE), torch.tensor(qsl, device=DEVICE)
    positions = torch.tensor(positions, device=DEVICE)
    got = paged_varlen_attention(query, kv, tables, qsl, positions, 256**-0.5,
                                 num_splits=num_splits, meeting=KeptZeros())[:real]
    want = paged_attention_ref(query[:real], kv, tables[:len(rows)],
                               torch.tensor(token_seq, device=DEVICE), positions[:real],
                               256**-0.5)
    assert _rel_err(got, want) < 1e-2


def _split_case(generator, decode: int, decode_cap: int, chunks: list[int], prefill_cap: int,
                tokens: int, num_slots: int = 64):
    """q, k, v, a, b, A_log, dt_bias at the 0.8B GDN shapes, a state pool, and a GdnSplit of
    `decode` decode rows (of decode_cap) then prefill chunks (of prefill_cap) padded to
    `tokens`, on distinct random slots."""
    heads, dim = 16, 128

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(DEVICE)

    slots = (torch.randperm(num_slots - 1, generator=generator) + 1).tolist()
    decode_slots = slots[:decode] + [0] * (decode_cap - decode)
    prefill_slots = [0] + slots[decode:decode + len(chunks)] + [0] * (prefill_cap - len(chunks))
    cu = [0, decode]
    for chunk in chunks:
        cu.append(cu[-1] + chunk)
    cu += [cu[-1]] * (prefill_cap + 2 - len(cu))
    table = torch.zeros(tokens // GDN_CHUNK + prefill_cap + 2, 2, dtype=torch.int64)
    offsets = torch.zeros(prefill_cap + 2, dtype=torch.int64)
    chunk_table(torch.tensor(cu).numpy(), table.numpy(), offsets.numpy(), GDN_CHUNK)
    split = GdnSplit(*(torch.tensor(t, device=DEVICE) for t in (decode_slots, cu,
                                                                prefill_slots)),
                     table.to(DEVICE), offsets.to(DEVICE), GDN_CHUNK)
    # query and key l2-normed, as the varlen conv hands them to the split (the reference's own
    # normalisation then changes them by the eps alone)
    qkv = tuple(randn(tokens, heads, dim) for _ in range(3))
    qkv = (*(l2norm(t).bfloat16() for t in qkv[:2]), qkv[2].bfloat16())
    gates = (randn(tokens, heads).bfloat16(), randn(tokens, heads).bfloat16(),
             randn(heads, scale=0.5) - 1.0, randn(heads).bfloat16())
    pool = randn(num_slots, heads, dim, dim, scale=0.1)
    return qkv, gates, pool, split, cu[len(chunks) + 1]


def _tensors(split: GdnSplit) -> tuple[torch.Tensor, ...]:
    return (split.decode_slots, split.cu_seqlens, split.slots, split.chunks,
            split.chunk_offsets)


def _all_padding(split: GdnSplit) -> GdnSplit:
    """A split of the same capacities in fresh buffers, every entry padding (as a graph's
    capture sees it)."""
    padding = GdnSplit(*(t.clone() for t in _tensors(split)), GDN_CHUNK)
    for buffer in (padding.decode_slots, padding.slots, padding.cu_seqlens):
        buffer.zero_()
    chunks, offsets = padding.chunks.cpu(), padding.chunk_offsets.cpu()
    chunk_table(padding.cu_seqlens.cpu().numpy(), chunks.numpy(), offsets.numpy(), GDN_CHUNK)
    padding.chunks.copy_(chunks)
    padding.chunk_offsets.copy_(offsets)
    return padding


def _meta(split: GdnSplit) -> StepMeta:
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    return StepMeta(empty, empty, empty, empty.view(0, 0).int(), empty, empty, empty, 1, split)


def _reference(qkv, gates, pool, split: GdnSplit, real: int):
    """Every real row on the reference: decode rows one token each, prefill rows as rows."""
    log_decay, beta = gdn_gates(*gates)
    decode = int((split.decode_slots != 0).sum())
    slots = torch.cat([split.decode_slots[:decode], split.slots[1:]])
    starts = torch.cat([torch.arange(decode, device=DEVICE), split.cu_seqlens[1:]])
    rows = int((split.slots[1:] != 0).sum())
    slots, starts = slots[:decode + rows], starts[:decode + rows + 1]
    longest = int((starts[1:] - starts[:-1]).max())
    return gated_delta_rule_ref(*(t[:real] for t in qkv), log_decay[:real], beta[:real], pool,
                                slots, starts, longest)


def test_the_split_gdn_matches_the_reference_and_replays_in_a_graph():
    """fla over the prefill sequences (fixed chunk table, inert padding entries, the decode
    tokens as sequence 0 on the sink), then the decode kernel over the decode rows (padding
    entries on the sink skipped), against every row on the reference; then the same op
    captured on an all-padding split and replayed on the real one, in the same buffers."""
    generator = torch.Generator().manual_seed(1)
    qkv, gates, pool, split, real = _split_case(generator, decode=5, decode_cap=16,
                                                chunks=[300, 1, 77, 64], prefill_cap=8,
                                                tokens=512)
    op = split_gdn_op(fla_sequences, triton_decode_rows)
    ref_pool = pool.clone()
    want = _reference(qkv, gates, ref_pool, split, real)
    eager_pool = pool.clone()
    got = op(*qkv, *gates, eager_pool, _meta(split))
    assert _rel_err(got[:real], want) < 2e-2
    # slot 0 is the sink: sequence 0 (the decode tokens) ran there, the reference did not
    assert _rel_err(eager_pool[1:], ref_pool[1:]) < 1e-2

    fixed = _all_padding(split)
    graph_pool = pool.clone()
    op(*qkv, *gates, graph_pool, _meta(fixed))  # warm (fla's autotuning) before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(*qkv, *gates, graph_pool, _meta(fixed))
    for mine, theirs in zip(_tensors(fixed), _tensors(split), strict=True):
        mine.copy_(theirs)
    graph_pool.copy_(pool)
    graph.replay()
    torch.testing.assert_close(captured[:real], got[:real], atol=0, rtol=0)
    torch.testing.assert_close(graph_pool[1:], eager_pool[1:], atol=0, rtol=0)


MODEL = load_model_config("qwen3.5-0.8b")


def test_fla_tuned_at_start_up_is_what_an_all_padding_step_finds():
    """fla autotunes a kernel at the first call of each key (heads, dims, dtypes). The engine
    tunes it on real sequences (tune_chunked_delta_rule) so that the padded warm-up, whose
    chunks are all masked out, finds a tuned key rather than timing empty kernels: the split
    op on an all-padding step adds no key to any of fla's autotuners."""
    from fla.ops.common import chunk_o
    from fla.ops.gated_delta_rule import chunk_fwd

    from resident.backends.gdn_prefill import tune_chunked_delta_rule
    from resident.kernels import chunk_states

    tuners = [chunk_fwd.chunk_gated_delta_rule_fwd_kkt_solve_kernel.fn,
              chunk_states._TUNED, chunk_o.chunk_fwd_kernel_o.fn]
    tune_chunked_delta_rule(MODEL, 1024, torch.bfloat16, torch.float32, DEVICE)
    tuned = [set(tuner.cache) for tuner in tuners]
    assert all(tuned), "the tuning call left an autotuner without a key"
    qkv, gates, pool, split, _ = _split_case(torch.Generator().manual_seed(3), decode=0,
                                             decode_cap=16, chunks=[64], prefill_cap=8,
                                             tokens=512)
    split_gdn_op(fla_sequences, triton_decode_rows)(*qkv, *gates, pool,
                                                    _meta(_all_padding(split)))
    torch.cuda.synchronize()
    assert [set(tuner.cache) for tuner in tuners] == tuned


def _prompts(count: int) -> dict[str, tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(2)
    lengths = torch.randint(8, 1500, (count,), generator=generator).tolist()
    return {f"p{i}": (torch.randint(0, MODEL.vocab_size, (n,), generator=generator).tolist(),
                      16) for i, n in enumerate(lengths)}


@pytest.mark.parametrize(("backend", "varlen_splits"),
                         [("triton", "off"), ("flashinfer", "off"), ("triton", "auto")])
def test_padded_steps_give_the_same_tokens_with_and_without_graphs(backend, varlen_splits):
    """24 prompts queued at once, 12 running: prefill steps of several rows and mixed steps
    with decode rows riding along, through every token bucket (a budget of 1024 tokens); with
    varlen_splits=auto the small buckets' attention splits its keys, its scratch and counters
    replayed by the graphs."""
    requests = _prompts(24)
    outputs = {}
    for graphs in ("off", "on"):
        config = EngineConfig(kv_cache_gib=2.0, max_num_seqs=12, max_model_len=4096,
                              decode_buckets=(1, 2, 4, 8, 12), prefill_token_budget=1024,
                              attention_backend=backend, cuda_graphs=graphs,
                              varlen_splits=varlen_splits)
        engine = build_engine(MODEL, config, DEVICE)
        outputs[graphs] = run_engine(engine, requests)
        steps = engine.stats()["steps"]
        assert steps["mixed"] > 0 and engine.runner.num_padded_prefills == (
            steps["mixed"] + steps["prefill"])
        if graphs == "on":
            # each size: a prefill form and mixed forms for 12 >> 2 and 12 decode rows
            assert [(b["tokens"], b["decode_rows"]) for b in engine.info()["prefill_graphs"]] == [
                (size, rows) for size in (128, 256, 512, 1024, 1036) for rows in (0, 3, 12)]
        del engine
        torch.cuda.empty_cache()
    assert outputs["on"] == outputs["off"]
