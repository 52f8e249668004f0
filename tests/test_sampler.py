"""The batched sampler (engine/draw.py, engine/sampler.py) on CPU: greedy rows take a decode
graph's argmax, the draw's token distribution is the reference per-row loop's (chi-square), a
seed's tokens do not depend on the row's batch, and a poison row fails alone."""

from __future__ import annotations

import pytest
import torch

from resident.engine.draw import Drawn
from resident.engine.readback import TokenReadback
from resident.engine.sampler import Sampler, SampleRow, StepLogits
from resident.engine.types import SamplingParams

CPU = torch.device("cpu")
VOCAB = 8
GREEDY = SamplingParams(max_tokens=4)
HOT = SamplingParams(max_tokens=4, temperature=5.0, seed=1)
# the 0.999 quantile of chi-square by degrees of freedom: a right sampler fails 1 in 1000
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def make_sampler(vocab: int = VOCAB, max_rows: int = 64) -> Sampler:
    return Sampler(CPU, 0, vocab, max_rows)


def sample(sampler: Sampler, logits: torch.Tensor, rows: list[SampleRow],
           greedy: torch.Tensor | None = None) -> Drawn:
    for row in rows:
        sampler.add(row.request_id, row.params)
    return sampler.sample(StepLogits(logits, greedy), rows)


def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The per-row loop the batched draw replaced (one row: top-k, a full sort for top-p, a
    softmax), with min-p, the filters joint (draw.py): the probabilities it draws from."""
    scaled = logits.double() / params.temperature
    kept = torch.ones_like(scaled, dtype=torch.bool)
    if 0 < params.top_k < scaled.shape[-1]:
        kept &= scaled >= torch.topk(scaled, params.top_k).values[-1]
    if params.top_p < 1.0:
        ordered, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        inside = (probs.cumsum(dim=-1) - probs) < params.top_p
        kept &= torch.zeros_like(kept).scatter(0, order, inside)
    scaled = scaled.masked_fill(~kept, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    kept = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return kept / kept.sum()


def reference_counts(logits: torch.Tensor, params: SamplingParams, draws: int) -> torch.Tensor:
    """The reference loop's own draws: an exponential race per draw, from a torch generator."""
    probs = reference_probs(logits, params)
    generator = torch.Generator().manual_seed(1234)
    tokens = [int((probs / torch.empty_like(probs).exponential_(generator=generator)).argmax())
              for _ in range(draws)]
    return torch.bincount(torch.tensor(tokens), minlength=logits.shape[-1]).double()


def batched_counts(logits: torch.Tensor, params: SamplingParams, draws: int) -> torch.Tensor:
    """The batched draw's: `draws` rows of one request, token indices 0..draws-1."""
    rows = [SampleRow("r", params, index) for index in range(draws)]
    sampler = make_sampler(max_rows=draws)
    drawn = sample(sampler, logits.expand(draws, -1).contiguous(), rows)
    assert not drawn.failed.any()
    return torch.bincount(drawn.tokens, minlength=logits.shape[-1]).double()


def two_sample_chi2(first: torch.Tensor, second: torch.Tensor) -> tuple[float, int]:
    """The two-sample chi-square statistic of equal-sized count vectors and its degrees of
    freedom (categories either saw, less one)."""
    seen = (first + second) > 0
    first, second = first[seen], second[seen]
    statistic = ((first - second) ** 2 / (first + second)).sum().item()
    return statistic, int(seen.sum()) - 1


LOGITS = torch.tensor([2.0, 1.5, 1.2, 0.7, 0.3, 0.0, -0.5, -1.0])
CASES = [
    SamplingParams(max_tokens=1, temperature=0.7, top_p=0.9, seed=3),
    SamplingParams(max_tokens=1, temperature=1.3, top_k=5, seed=4),
    SamplingParams(max_tokens=1, temperature=1.0, min_p=0.2, seed=5),
    SamplingParams(max_tokens=1, temperature=0.5, top_k=6, top_p=0.8, seed=6),
]


@pytest.mark.parametrize("params", CASES, ids=["t0.7-p0.9", "t1.3-k5", "t1-minp0.2",
                                               "t0.5-k6-p0.8"])
def test_the_batched_draw_matches_the_reference_loop(params):
    """8000 draws of each against 8000 of the reference loop: the chi-square statistic stays
    under its 0.999 quantile; against a loop at another temperature or top-p it does not (the
    test can tell a wrong sampler)."""
    draws = 8000
    batched = batched_counts(LOGITS, params, draws)
    statistic, dof = two_sample_chi2(batched, reference_counts(LOGITS, params, draws))
    assert statistic < CHI2_999[dof], (statistic, dof, batched.tolist())
    for wrong in (params.__class__(**{**params.__dict__, "temperature": 1.6 * params.temperature}),
                  params.__class__(**{**params.__dict__, "top_p": 0.6 * params.top_p})):
        statistic, dof = two_sample_chi2(batched, reference_counts(LOGITS, wrong, draws))
        assert statistic > CHI2_999.get(dof, 24.32), (wrong, statistic)


def test_greedy_rows_take_the_graphs_argmax_and_no_draw_runs():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    greedy = logits.argmax(dim=-1)
    sampler = make_sampler(50)
    rows = [SampleRow("a", GREEDY, 0), SampleRow("b", GREEDY, 0)]
    assert sample(sampler, logits, rows, greedy) is None
    assert sampler.greedy(StepLogits(logits, greedy), 2).tolist() == greedy[:2].tolist()


def test_a_sampled_row_draws_and_leaves_the_graphs_output_alone():
    logits = torch.zeros(2, 1000)  # flat: a draw at temperature 5 almost never gives token 0
    greedy = logits.argmax(dim=-1)
    before = greedy.clone()
    drawn = sample(make_sampler(1000), logits, [SampleRow("cold", GREEDY, 0),
                                                 SampleRow("hot", HOT, 0)], greedy)
    assert drawn.tokens[0] == 0 and drawn.tokens[1] != 0
    assert torch.equal(greedy, before), "the sampler wrote into the graph's argmax"


def test_a_step_by_slot_draws_only_while_an_added_request_samples():
    """stage_by_slot reads no rows: the bucket draws by slot while any added request samples
    (its greedy slots then take their greedy tokens) and not once none does; the rows written
    whole land in their slots either way, before the draw reads them."""
    from resident.engine.sampling_state import SamplingSlots

    vocab, bucket = 1000, 4
    slot_ids = torch.tensor([2, 0, 3, 1])
    sampler = Sampler(CPU, 0, vocab, 8, slots=SamplingSlots(4, 8, slot_ids, CPU))
    logits = torch.zeros(bucket, vocab)  # flat: a draw at temperature 5 almost never gives 0
    step = StepLogits(logits, logits.argmax(dim=-1))
    rows = {"cold": SampleRow("cold", GREEDY, 0), "hot": SampleRow("hot", HOT, 0)}
    sampler.add("cold", GREEDY)
    assert not sampler.stage_by_slot([(2, rows["cold"])])
    sampler.add("hot", HOT)
    assert sampler.stage_by_slot([(0, rows["hot"])])
    drawn = sampler.draw_decode(step, bucket).first(2)
    assert drawn.tokens.tolist()[0] == 0 and drawn.tokens.tolist()[1] != 0  # slots 2, 0
    assert sampler.slots.rows_written == 2
    sampler.drop("hot")
    assert not sampler.stage_by_slot([])


def test_a_host_planned_decode_step_draws_its_uploaded_rows():
    """stage_rows uploads a decode step's rows only when one samples; draw_decode then draws
    the bucket from them (its padding rows too), and the first rows' tokens are what a varlen
    step's draw of the same rows gives."""
    vocab, bucket = 1000, 4
    sampler = make_sampler(vocab)
    logits = torch.randn(bucket, vocab, generator=torch.Generator().manual_seed(2))
    step = StepLogits(logits, logits.argmax(dim=-1))
    rows = [SampleRow("cold", GREEDY, 0), SampleRow("hot", HOT, 3)]
    for row in rows:
        sampler.add(row.request_id, row.params)
    assert not sampler.stage_rows(rows[:1])
    assert sampler.stage_rows(rows)
    drawn = sampler.draw_decode(step, bucket).first(2)
    varlen = sampler.sample(StepLogits(logits[:2]), rows)
    assert drawn.tokens.tolist() == varlen.tokens.tolist()
    assert drawn.tokens[0] == logits[0].argmax()


def test_a_seed_draws_the_same_tokens_in_any_row_of_any_batch():
    """Row 'me' (seed 42) alone, then at row 5 of 16 beside other requests' rows, at token
    indices 0..29: the same tokens. Its noise is keyed by (seed, index) only."""
    vocab = 300
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(30, vocab, generator=generator)
    me = SamplingParams(max_tokens=30, temperature=1.0, top_p=0.95, seed=42)
    alone = [int(sample(make_sampler(vocab), logits[i:i + 1], [SampleRow("me", me, i)])
                 .tokens[0]) for i in range(30)]
    crowded = []
    for index in range(30):
        others = [SampleRow(f"o{j}", SamplingParams(max_tokens=30, temperature=0.9,
                                                    top_k=j + 1), index) for j in range(15)]
        rows = others[:5] + [SampleRow("me", me, index)] + others[5:]
        batch = torch.randn(16, vocab, generator=generator)
        batch[5] = logits[index]
        crowded.append(int(sample(make_sampler(vocab), batch, rows).tokens[5]))
    assert alone == crowded
    assert len(set(alone)) > 10, "a draw that ignores the token index repeats itself"


def test_a_triton_sampler_draws_the_torch_samplers_tokens_step_after_step():
    """The `triton` sampler (its race in the interpreter, its judges' counters kept between
    draws), step after step with the row count changing and back, gives the `torch` sampler's
    tokens (the same noise). That the counters stay zero is the draw's test's: stale ones
    cost rounds, and a later round still finds the same token here."""
    vocab = 300
    generator = torch.Generator().manual_seed(5)
    samplers = [Sampler(CPU, 0, vocab, 8, name) for name in ("torch", "triton")]
    params = [SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, seed=s) for s in range(4)]
    for index, num_rows in enumerate((4, 2, 4)):
        logits = torch.randn(num_rows, vocab, generator=generator) * 2
        rows = [SampleRow(f"r{i}", params[i], index) for i in range(num_rows)]
        torch_tokens, triton_tokens = (sample(sampler, logits, rows).tokens.tolist()
                                       for sampler in samplers)
        assert triton_tokens == torch_tokens


def test_unseeded_requests_differ():
    """Requests without a seed get distinct ones from the engine's: the same logits and
    index give different tokens."""
    logits = torch.zeros(8, 1000)
    params = SamplingParams(max_tokens=1, temperature=1.0)
    rows = [SampleRow(f"u{i}", params, 0) for i in range(8)]
    assert len(set(sample(make_sampler(1000), logits, rows).tokens.tolist())) > 4


def test_a_poison_row_fails_alone():
    """A row of NaN logits and a row at temperature 1e-40 (its logits overflow float32) are
    flagged and keep their greedy token; the rows beside them draw what they draw alone."""
    vocab = 64
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3))
    logits[1] = float("nan")
    rows = [SampleRow("a", SamplingParams(max_tokens=1, temperature=0.8, seed=1), 0),
            SampleRow("nan", SamplingParams(max_tokens=1, temperature=0.8, seed=2), 0),
            SampleRow("tiny", SamplingParams(max_tokens=1, temperature=1e-40, seed=3), 0),
            SampleRow("b", SamplingParams(max_tokens=1, temperature=1.2, top_k=9, seed=4), 0)]
    drawn = sample(make_sampler(vocab), logits, rows)
    assert drawn.failed.tolist() == [False, True, True, False]
    assert 0 <= int(drawn.tokens[1]) < vocab and int(drawn.tokens[2]) == int(logits[2].argmax())
    for row in (0, 3):
        alone = sample(make_sampler(vocab), logits[row:row + 1], [rows[row]])
        assert int(alone.tokens[0]) == int(drawn.tokens[row])


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_the_read_back_gives_each_rows_token_and_failure(name):
    """A draw with poison rows read back as a step reads it, whole and for its first rows:
    the `triton` sampler's tokens and failures share one allocation, read in one copy (the
    layout's offsets are what this checks), the `torch` sampler's are read apart."""
    vocab = 64
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(3))
    logits[1] = logits[4] = float("nan")
    rows = [SampleRow(f"r{i}", SamplingParams(max_tokens=1, temperature=0.9, seed=i), 0)
            for i in range(6)]
    drawn = sample(Sampler(CPU, 0, vocab, 8, name), logits, rows)
    assert (drawn.packed is not None) == (name == "triton")
    readback = TokenReadback(CPU, 8)
    for num_rows in (6, 3, 6):
        first = drawn.first(num_rows)
        readback.start(first.tokens, None, first.failed, first.packed)
        assert readback.wait() == drawn.tokens[:num_rows].tolist()
        assert readback.failed() == [row for row in (1, 4) if row < num_rows]


class _RecordedEvent:
    """Stands in for the CUDA event a GPU read-back records: the records and waits, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def record(self, stream) -> None:
        self.calls.append("record")

    def synchronize(self) -> None:
        self.calls.append("wait")


def test_a_read_back_wait_always_follows_a_mark_past_its_copy():
    """`start` records no event: a step launched ahead marks after it (one record a step, not
    two), and where nothing marked since the copy, the wait marks first, so it never returns
    before the copy is done."""
    readback = TokenReadback(CPU, 8)
    readback._event = event = _RecordedEvent()
    tokens = torch.arange(4)
    readback.start(tokens)
    readback.mark()  # the next step's launch
    assert readback.wait() == [0, 1, 2, 3]
    assert event.calls == ["record", "wait"]
    event.calls.clear()
    readback.start(tokens)  # no launch ahead
    readback.wait()
    assert event.calls == ["record", "wait"]
    event.calls.clear()
    readback.sync()  # a step that sampled nothing waits on the last mark as it is
    assert event.calls == ["wait"]


@pytest.mark.parametrize("field, value", [("temperature", -0.1), ("temperature", float("nan")),
                                          ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
                                          ("min_p", 1.5), ("min_p", -0.1)])
def test_sampling_params_refuse_values_out_of_range(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(max_tokens=1, **{field: value})


def test_the_triton_race_draws_the_torch_references_tokens():
    """kernels/gumbel_race.py (in the interpreter) against draw.race: the same noise bits, so
    the same tokens, with filtered-out ids, a min-p floor, and a vocabulary over two chunks."""
    from resident.engine.draw import race, row_keys, vocab_counters
    from resident.kernels.gumbel_race import gumbel_race_triton

    generator = torch.Generator().manual_seed(11)
    for rows, vocab in ((5, 300), (3, 9000)):
        scores = torch.randn(rows, vocab, generator=generator) * 2
        scores[scores < -1.5] = float("-inf")
        keys = row_keys(torch.randint(-2**62, 2**62, (rows,), generator=generator),
                        torch.arange(rows) * 17)
        floors = torch.tensor([float("-inf"), 0.5, 1.0, float("-inf"), 2.0])[:rows]
        want = race(scores, keys, floors, vocab_counters(vocab, CPU))
        got = gumbel_race_triton(scores, keys, floors)
        assert got.tolist() == want.tolist()
        assert all(scores[i, t] >= floors[i] for i, t in enumerate(got.tolist()))


def test_the_triton_rejection_race_draws_the_torch_filters_tokens():
    """kernels/nucleus_race.py (in the interpreter) against the torch filter and race: the same
    noise, so the same tokens, over rows of every filter (tight top-p on flat logits takes
    several rounds), a vocabulary over two chunks, -inf logits, strided parameter columns and
    greedy rows; a NaN row and a 1e-40 temperature fail alone and keep their greedy tokens.
    The draws of one vocabulary share kept counters: each judge leaves its own at zero."""
    from resident.engine.draw import RowParams, draw, vocab_counters
    from resident.engine.sampling_state import ParamColumns
    from resident.kernels.gdc import KeptZeros
    from resident.kernels.nucleus_race import ROUNDS

    generator = torch.Generator().manual_seed(7)
    settings = [(0.7, 0, 0.9, 0.0), (1.3, 5, 1.0, 0.0), (1.0, 0, 1.0, 0.2), (0.5, 6, 0.8, 0.0),
                (0.0, 0, 1.0, 0.0), (2.0, 40, 0.05, 0.0), (1.0, 0, 0.99, 0.05),
                (5.0, 0, 0.02, 0.0)]
    for vocab in (300, 9000):
        columns = ParamColumns(len(settings), CPU)
        for row, (temperature, top_k, top_p, min_p) in enumerate(settings):
            columns.floats_gpu[row] = torch.tensor([temperature, top_p, min_p])
            columns.ints_gpu[row, :2] = torch.tensor([top_k, (-1) ** row * (row + 1) << 40])
        params = columns.params(len(settings))
        counters, meeting = vocab_counters(vocab, CPU), KeptZeros()
        for draw_index in range(3):
            columns.ints_gpu[:, 2] = draw_index * 11 + torch.arange(len(settings))
            logits = torch.randn(len(settings), vocab, generator=generator) * 2
            logits[logits < -2.5] = float("-inf")
            greedy = logits.argmax(dim=-1)
            want = draw(logits, params, greedy, counters, "torch", fused=True)
            got = draw(logits, params, greedy, counters, "triton", meeting=meeting)
            assert got.tokens.tolist() == want.tokens.tolist()
            assert not got.failed.any()
            assert not meeting.get((ROUNDS + 1, len(settings)), torch.int32, CPU).any()
    poison = torch.randn(3, 300, generator=generator)
    poison[0, 17] = float("nan")
    poison_params = RowParams(torch.tensor([1.0, 1e-40, 0.8]), torch.zeros(3, dtype=torch.int64),
                              torch.ones(3), torch.zeros(3), torch.arange(3), torch.zeros(3,
                              dtype=torch.int64))
    greedy = poison.argmax(dim=-1)  # the NaN's id in row 0, as torch.argmax takes it
    got = draw(poison, poison_params, greedy, vocab_counters(300, CPU), "triton")
    assert got.failed.tolist() == [True, True, False]
    assert greedy[0] == 17 and got.tokens[:2].tolist() == greedy[:2].tolist()


# the bit patterns that decide races (the smallest E), both ends, the 24-bit uniform's
# degenerate one (bits >> 8 == 2**24 - 1: its u rounded to 1.0), and a sweep between
NOISE_BITS = ([0, 1, 2, 255, 256, 2**24 - 1, 2**24, 2**29, 2**31, 2**32 - 256, 2**32 - 129,
               2**32 - 128, 2**32 - 1] + list(range(0, 2**32, 2**32 // 997)))


def test_the_noise_is_gumbel_to_fp32_rounding_and_never_plus_infinite():
    """draw.gumbel_from_bits against float64's -log(-log1p(-w)): equal to a few fp32 roundings
    wherever an id can still win (noise > -1), never NaN or +inf (the 24-bit uniform it
    replaced gave +inf at 256 of the 2**32 patterns), -inf only at the top 128 (w rounds to 1).
    """
    from resident.engine.draw import gumbel_from_bits

    bits = torch.tensor(NOISE_BITS, dtype=torch.int64)
    noise = gumbel_from_bits(bits)
    w = (bits.double() + 0.5) / 2**32
    want = -torch.log(-torch.log1p(-w))
    assert not noise.isnan().any() and not (noise == float("inf")).any()
    assert ((noise == float("-inf")) == (bits >= 2**32 - 128)).all()
    contending = want > -1
    assert contending.sum() > 500
    assert (noise.double() - want)[contending].abs().max() < 4e-6
    smallest = bits < 2**24  # E < 0.004: the series, to fp32's last bits
    assert ((noise.double() - want)[smallest] / want[smallest]).abs().max() < 2e-7


def test_the_kernels_noise_is_the_references():
    """kernels/gumbel_race._gumbel (interpreter) gives draw.gumbel_from_bits's values."""
    from resident.engine.draw import gumbel_from_bits
    from resident.kernels.gumbel_race import gumbel_of_bits

    bits = torch.tensor(NOISE_BITS, dtype=torch.int64)
    torch.testing.assert_close(gumbel_of_bits(bits), gumbel_from_bits(bits), rtol=1e-6,
                               atol=1e-6)
