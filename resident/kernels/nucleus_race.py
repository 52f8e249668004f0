"""The batched draw as a rejection race on Triton kernels: temperature, top-k, top-p and min-p
by row, with no filter pass, no sort and no host sync.

Every filter of engine/draw.py keeps an upper set of a row's scaled logits y = x / T: top-k the
k largest, top-p the largest whose mass ranked above stays under p, min-p those within
log(min_p) of the largest; together they keep the intersection (draw.py: joint). So the
Gumbel race over the kept set (argmax of y + noise over it) needs no cutoff: race over the whole
row, and if the winner w is kept (judged from the count and mass of y > y_w, one pass), it is the
kept set's winner, since the kept set is inside what it beat; if not, every kept token lies
above y_w, so race again over y > y_w. A round is one pass over the rows still racing, and a
winner is kept with probability about top_p or more, so most rows finish in the first. A graph
holds ROUNDS rounds: a finished row's programs return at once, and a row still racing after
them takes its last winner (above every rejected one: a near miss, rarer than 1 in 10**6 rows
at top_p 0.9).

The noise is draw.py's, hashed in registers (kernels/gumbel_race.py), so on the same logits this
draws the torch filter's tokens up to float rounding at a cutoff. The row's largest logit is
read at its argmax, which the caller has (a decode graph computes it): a NaN there (torch.argmax
takes a NaN for the largest), +inf or -inf (every id -inf) fails the row (draw.Drawn.failed),
which keeps its greedy token.

Kernels: a first pass (the sum of exp(y - top), the race over all ids) and ROUNDS rounds, the
first of which only counts above the first pass's winner: the race's noise (a hash and two logs
an id) is most of a pass's arithmetic, and nine rows in ten need no second race. A
row is split into chunks (grid rows x chunks). The last program of a row to finish a pass (an
atomic counter a row and pass) judges it: it reduces the row's partials and writes the row's
token, or sets the next pass's floor (_judge); the last round's judge writes every undecided
row's token, so no kernel of its own picks them. A round's programs of a decided row return
after two loads; before, every program of a round judged the pass before it for itself, 61
programs a row at 248k ids (round 2 took 43 us at 64 rows on the H200 while few rows raced in
it: results/2026-12-04-h200-race-v3).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from resident.kernels.gdc import KeptZeros, last_to_arrive, pdl_wait_then_release
from resident.kernels.gumbel_race import MAX_BLOCK, MAX_CHUNK, _gumbel, _mix32
from resident.kernels.pdl import launch_options

# A round no row reaches costs ~1.7 us (H200): a seventh keeps three pivot rounds for little
ROUNDS = 7
PIVOTS = 8  # thresholds a round counts beside its floor, to raise the next floor
# The first round that counts them. A round that counts them takes 180 registers a thread (2
# programs an SM), one that does not 72, and a row that loses once reaches round 3 and one that
# loses twice (about 1 in 100 at top_p 0.9) round 4: at 64 rows, pivots from round 3 / 4 / 5
# drew in 124.6 / 99.7 / 86.8 us with 6 rounds (tests/gpu/time_draw.py, H200,
# results/2026-12-05-h200-race-rounds). Pivots are what decide tight top-k rows (without any the
# CPU tests' top-k rows end as near misses), so 7 rounds keep three pivot rounds, as 6 rounds
# with pivots from 4 had.
PIVOTS_FROM = 5
# Programs a late round (2 on) launches an SM, which stride over the rows its round takes: a
# round with pivots fits 2 an SM, one without 7
LATE_PROGRAMS_AN_SM = 4


@triton.jit
def _row_key(seeds, indices, row, ints_stride):
    """draw.row_keys for one row, in uint32 arithmetic."""
    seed = tl.load(seeds + row * ints_stride)
    low = (seed & 0xFFFFFFFF).to(tl.uint32)
    high = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    key = _mix32(tl.load(indices + row * ints_stride).to(tl.uint32) * 0x9E3779B9)
    key = _mix32(key + high)
    return _mix32(key ^ low)


@triton.jit
def _row_top(logits, stride, greedy, row, temperature):
    """The row's largest scaled logit, read at its argmax (`greedy`)."""
    return tl.load(logits + row * stride + tl.load(greedy + row)).to(tl.float32) / temperature


@triton.jit
def _fails(top):
    """Whether a row whose largest scaled logit is `top` fails: NaN (torch.argmax takes a NaN
    for the largest), +inf, or -inf (every id)."""
    return (top != top) | (top == float("inf")) | (top == float("-inf"))


@triton.jit
def _row_total(part_b, row, num_chunks, SPAN: tl.constexpr):
    """The first pass's sum of exp(y - top) over the row."""
    chunks = tl.arange(0, SPAN)
    return tl.sum(tl.load(part_b + row * num_chunks + chunks, mask=chunks < num_chunks,
                          other=0.0, cache_modifier=".cg"), axis=0)


@triton.jit
def _winner(score, ident, ywin, base, num_chunks, SPAN: tl.constexpr):
    """A pass's race partials of a row (at `base`) -> (winning id, its y, its score)."""
    chunks = tl.arange(0, SPAN)
    scores = tl.load(score + base + chunks, mask=chunks < num_chunks, other=float("-inf"),
                     cache_modifier=".cg")
    best = tl.argmax(scores, axis=0)
    return (tl.load(ident + base + best, cache_modifier=".cg"),
            tl.load(ywin + base + best, cache_modifier=".cg"), tl.max(scores, axis=0))


@triton.jit
def _sums(part_a, part_b, base, num_chunks, SPAN: tl.constexpr):
    chunks = tl.arange(0, SPAN)
    inside = chunks < num_chunks
    return (tl.sum(tl.load(part_a + base + chunks, mask=inside, other=0.0,
                           cache_modifier=".cg"), axis=0),
            tl.sum(tl.load(part_b + base + chunks, mask=inside, other=0.0,
                           cache_modifier=".cg"), axis=0))


@triton.jit
def _pivots(floor, top, PIVOTS: tl.constexpr):
    """[PIVOTS] scaled logits evenly inside (floor, top): the thresholds a round also counts."""
    return floor + (top - floor) * ((tl.arange(0, PIVOTS) + 1).to(tl.float32) / (PIVOTS + 1))


@triton.jit
def _kept(y, count, mass, top, total, top_ks, top_ps, min_ps, row, floats_stride, ints_stride):
    """Whether a token of scaled logit y (a scalar or a block), with `count` tokens and `mass`
    (sum of exp(y - top)) strictly above it, survives the row's top-k, top-p and min-p. A
    threshold that would not survive is a floor: nothing at or under it survives either."""
    top_k = tl.load(top_ks + row * ints_stride)
    top_p = tl.load(top_ps + row * floats_stride)
    min_p = tl.load(min_ps + row * floats_stride)
    # where, not | and &: the interpreter cannot or a scalar's bool with a block's
    by_k = tl.where(top_k > 0, count < top_k, True)
    by_p = tl.where(top_p < 1.0, mass < top_p * total, True)
    by_min_p = (y - top) >= tl.log(min_p)
    return tl.where(by_k, tl.where(by_p, by_min_p, False), False)


@triton.jit
def _pass(logits, stride, row, chunk, temperature, key, floor, top, vocab,
          CHUNK: tl.constexpr, BLOCK: tl.constexpr, PIVOTS: tl.constexpr, FIRST: tl.constexpr,
          COUNT_PIVOTS: tl.constexpr, RACE: tl.constexpr, FAST: tl.constexpr):
    """One chunk's pass over y = x / temperature, top the row's largest y. FIRST: the sum of
    exp(y - top) and the race over every id; else (count, sum of exp(y - top)) of y > floor,
    the same at each of _pivots(floor, top) where COUNT_PIVOTS (else zeros: every pivot then
    looks kept by top-k and top-p and does not raise the floor), and the race over y > floor
    where RACE (else no noise is drawn: score -inf). Both return the race's (score, id). Each
    lane keeps its own count, mass and race over the chunk's blocks, reduced once at the end: a
    block reduction a block made the passes over every row compute-bound. The pivots, counted
    only for the few rows still racing, are reduced a block at a time."""
    lanes = tl.arange(0, BLOCK)
    lane_a = tl.zeros([BLOCK], dtype=tl.float32)
    lane_b = tl.zeros([BLOCK], dtype=tl.float32)
    # each id's hash input, key + id * GOLDEN32 (draw.py), advanced by a block's per block
    lane_bits = key + (chunk * CHUNK + lanes).to(tl.uint32) * 0x9E3779B9
    pivot_weights = tl.exp(_pivots(floor, top, PIVOTS) - top)
    # the pivots' partials are reduced over each block as it goes: kept by lane, [BLOCK, PIVOTS]
    # of them spilled registers at the first pass's block, and a quarter block made a racing
    # row's 8,192-id chunk 32 loads in a row (rounds 2 and 3: 50 and 39 us at 64 rows; 43 and
    # 7 since, with 4,096-id chunks: results/2026-12-04-h200-race-v3)
    pivot_counts = tl.zeros([PIVOTS], dtype=tl.float32)
    pivot_masses = tl.zeros([PIVOTS], dtype=tl.float32)
    lane_score = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_id = tl.full([BLOCK], 0, tl.int32) + chunk * CHUNK
    for start in range(0, CHUNK, BLOCK):
        ids = chunk * CHUNK + start + lanes
        inside = ids < vocab
        x = tl.load(logits + row * stride + ids, mask=inside, other=float("-inf"))
        y = x.to(tl.float32) / temperature
        if FIRST:  # y <= top: no overflow; a masked id's exp(-inf) adds 0
            lane_b += tl.exp(y - top)
            racing = inside
        else:
            racing = inside & (y > floor)
            weight = tl.where(racing, tl.exp(y - top), 0.0)
            lane_a += racing.to(tl.float32)
            lane_b += weight
            if COUNT_PIVOTS:
                # in weights, not y: Triton 3.6's layout pass miscompiles y[:, None] here (an
                # operand used before its definition). exp rounds ties together, so this can
                # only undercount above a pivot: a pivot then looks kept, and the floor is not
                # raised.
                above = (weight[:, None] > pivot_weights[None, :]).to(tl.float32)
                pivot_counts += tl.sum(above, axis=0)
                pivot_masses += tl.sum(above * weight[:, None], axis=0)
        if RACE:
            noisy = tl.where(racing, y + _gumbel(_mix32(lane_bits), FAST), float("-inf"))
            lane_bits += (BLOCK * 0x9E3779B9) % 4294967296
            better = noisy > lane_score  # a lane's earlier block wins its ties
            lane_id = tl.where(better, ids, lane_id)
            lane_score = tl.where(better, noisy, lane_score)
    best_score = tl.max(lane_score, axis=0)
    # the smallest id among the best, as torch.argmax's first index
    best_id = tl.min(tl.where(lane_score == best_score, lane_id, vocab + CHUNK), axis=0)
    return (tl.sum(lane_a, axis=0), tl.sum(lane_b, axis=0), pivot_counts, pivot_masses,
            best_score, best_id.to(tl.int64))


@triton.jit
def _store_pass(part_a, part_b, pivot_a, pivot_b, score, ident, ywin, logits, stride, row,
                temperature, at, stat_a, stat_b, pivot_counts, pivot_masses, best_score, best_id,
                PIVOTS: tl.constexpr):
    tl.store(part_a + at, stat_a)
    tl.store(part_b + at, stat_b)
    tl.store(pivot_a + at * PIVOTS + tl.arange(0, PIVOTS), pivot_counts)
    tl.store(pivot_b + at * PIVOTS + tl.arange(0, PIVOTS), pivot_masses)
    tl.store(score + at, best_score)
    tl.store(ident + at, best_id)
    tl.store(ywin + at, tl.load(logits + row * stride + best_id).to(tl.float32) / temperature)


@triton.jit
def _first_kernel(logits, stride, temperatures, top_ks, top_ps, min_ps, seeds, indices,
                  floats_stride, ints_stride, greedy, tops, part_a, part_b, pivot_a, pivot_b,
                  score, ident, ywin, floors, judged, tokens, failures, arrivals, racing,
                  num_racing, num_rows, vocab, num_chunks, CHUNK: tl.constexpr,
                  BLOCK: tl.constexpr, SPAN: tl.constexpr, PIVOTS: tl.constexpr,
                  PIVOTS_FROM: tl.constexpr, FAST: tl.constexpr, USE_PDL: tl.constexpr):
    """The first pass of every sampled row. Program 0 of each row writes its failure flag, the
    greedy token of a greedy or failed row (a sampled row's comes from a judge: _judge), and
    for a sampled row its top to `tops` (for the rounds: one load there, not two in a row).
    The row's last program to finish sets round 1's floor and candidate."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    pdl_wait_then_release(USE_PDL)
    temperature = tl.load(temperatures + row * floats_stride)
    failed = False
    top = 0.0
    if temperature > 0:
        top = _row_top(logits, stride, greedy, row, temperature)
        failed = _fails(top)
    if (row == 0) & (chunk == 0):
        tl.store(num_racing + 2, 0)  # round 1's judges list round 2's rows
    if chunk == 0:
        tl.store(failures + row, failed)
        if (temperature <= 0) | failed:
            tl.store(tokens + row, tl.load(greedy + row))
        if temperature > 0:
            tl.store(tops + row, top)
    if (temperature > 0) & (failed == 0):
        key = _row_key(seeds, indices, row, ints_stride)
        count, mass, pivot_counts, pivot_masses, best_score, best_id = _pass(
            logits, stride, row, chunk, temperature, key, 0.0, top, vocab, CHUNK, BLOCK,
            PIVOTS, True, False, True, FAST)
        _store_pass(part_a, part_b, pivot_a, pivot_b, score, ident, ywin, logits, stride,
                    row, temperature, row * num_chunks + chunk, count, mass, pivot_counts,
                    pivot_masses, best_score, best_id, PIVOTS)
        _judge(top_ks, top_ps, min_ps, floats_stride, ints_stride, part_a, part_b, pivot_a,
               pivot_b, score, ident, ywin, floors, judged, tokens, arrivals, racing,
               num_racing, top, row, 0, num_rows, num_chunks, SPAN, PIVOTS, PIVOTS_FROM, False)


@triton.jit
def _floor(pivot_a, pivot_b, score, ident, ywin, floors, top, total,
           top_ks, top_ps, min_ps, row, floats_stride, ints_stride, before, num_rows, num_chunks,
           SPAN: tl.constexpr, PIVOTS: tl.constexpr, PIVOTS_FROM: tl.constexpr):
    """After pass `before` (its winner not the answer): the next pass's floor and the candidate
    it judges (-1: none). The floor is pass `before`'s winner, or the highest of its pivots
    that does not survive when that lies at or above the winner (which then lost too). Passes
    before PIVOTS_FROM count no pivots."""
    if before == 1:  # pass 1 judged the first pass's winner and raced nothing: race above it
        floor = tl.load(floors + num_rows + row)
        candidate = tl.full([], -1, tl.int64)
    else:
        base = before * num_rows * num_chunks + row * num_chunks
        winner_id, winner_y, _ = _winner(score, ident, ywin, base, num_chunks, SPAN)
        floor = winner_y
        candidate = winner_id
        if before >= PIVOTS_FROM:
            chunks = tl.arange(0, SPAN)
            at = (base + chunks)[:, None] * PIVOTS + tl.arange(0, PIVOTS)[None, :]
            inside = (chunks < num_chunks)[:, None]
            counts = tl.sum(tl.load(pivot_a + at, mask=inside, other=0.0, cache_modifier=".cg"),
                            axis=0)
            masses = tl.sum(tl.load(pivot_b + at, mask=inside, other=0.0, cache_modifier=".cg"),
                            axis=0)
            pivots = _pivots(tl.load(floors + before * num_rows + row), top, PIVOTS)
            lost = _kept(pivots, counts, masses, top, total, top_ks, top_ps, min_ps, row,
                         floats_stride, ints_stride) == 0
            highest = tl.max(tl.where(lost, pivots, float("-inf")), axis=0)
            floor = tl.where(highest >= winner_y, highest, winner_y)
            candidate = tl.where(highest >= winner_y, -1, winner_id)
    return floor, candidate


@triton.jit
def _judge(top_ks, top_ps, min_ps, floats_stride, ints_stride, part_a, part_b, pivot_a,
           pivot_b, score, ident, ywin, floors, judged, tokens, arrivals, racing,
           num_racing, top, row, step, num_rows, num_chunks, SPAN: tl.constexpr,
           PIVOTS: tl.constexpr, PIVOTS_FROM: tl.constexpr, LAST: tl.constexpr):
    """Called by every program of a row once its part of pass `step` is stored; the last one
    to arrive (a counter a row and pass) judges the pass: its candidate, when it survives, is
    the row's token (`tokens`); else pass step + 1's floor and candidate (_floor), or
    after the LAST pass the pass's winner (a near miss: above every rejected one, not judged).
    So a round's programs of a decided row return after two loads, and only one program a row
    reduces the partials (every program of the row did, 61 at 248k ids, when each round
    opened by judging the pass before)."""
    if last_to_arrive(arrivals + step * num_rows + row, num_chunks):
        total = _row_total(part_b, row, num_chunks, SPAN)
        kept = False
        if step > 0:
            candidate = tl.load(judged + step * num_rows + row)
            if candidate >= 0:
                count, mass = _sums(part_a, part_b, (step * num_rows + row) * num_chunks,
                                    num_chunks, SPAN)
                if _kept(tl.load(floors + step * num_rows + row), count, mass, top, total,
                         top_ks, top_ps, min_ps, row, floats_stride, ints_stride):
                    kept = True
                    tl.store(tokens + row, candidate)
        if LAST:
            if not kept:
                winner_id, _, _ = _winner(score, ident, ywin,
                                          (step * num_rows + row) * num_chunks, num_chunks, SPAN)
                tl.store(tokens + row, winner_id)
        elif not kept:
            floor, candidate = _floor(pivot_a, pivot_b, score, ident, ywin, floors, top, total,
                                      top_ks, top_ps, min_ps, row, floats_stride, ints_stride,
                                      step, num_rows, num_chunks, SPAN, PIVOTS, PIVOTS_FROM)
            tl.store(floors + (step + 1) * num_rows + row, floor)
            tl.store(judged + (step + 1) * num_rows + row, candidate)
            if step >= 1:  # round 1 takes every row; later rounds the ones listed here
                listed = tl.atomic_add(num_racing + step + 1, 1)
                tl.store(racing + (step + 1) * num_rows + listed, row)
        tl.store(arrivals + step * num_rows + row, 0)  # zero again for the next draw


@triton.jit
def _round(row, chunk, logits, stride, temperatures, top_ks, top_ps, min_ps, seeds, indices,
           floats_stride, ints_stride, tops, part_a, part_b, pivot_a, pivot_b, score, ident,
           ywin, floors, judged, tokens, arrivals, racing, num_racing, num_rows, vocab,
           num_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPAN: tl.constexpr,
           PIVOTS: tl.constexpr, PIVOTS_FROM: tl.constexpr, STEP: tl.constexpr,
           LAST: tl.constexpr, FAST: tl.constexpr):
    """Pass STEP over one chunk of an undecided row, above the floor pass STEP - 1's judge set,
    then the row's judge if this program is its last to arrive. Round 1 only counts (no noise
    drawn: the race is most of a pass's arithmetic), so a row whose first winner loses races
    above it in round 2, whose winner round 3 judges. Rounds from PIVOTS_FROM on count pivots,
    which raise the floor fastest (tight top-k)."""
    temperature = tl.load(temperatures + row * floats_stride)
    top = tl.load(tops + row)
    floor = tl.load(floors + STEP * num_rows + row)
    key = _row_key(seeds, indices, row, ints_stride)
    count, mass, pivot_counts, pivot_masses, best_score, best_id = _pass(
        logits, stride, row, chunk, temperature, key, floor, top, vocab, CHUNK, BLOCK,
        PIVOTS, False, STEP >= PIVOTS_FROM, STEP != 1, FAST)
    _store_pass(part_a, part_b, pivot_a, pivot_b, score, ident, ywin, logits, stride,
                row, temperature, (STEP * num_rows + row) * num_chunks + chunk, count,
                mass, pivot_counts, pivot_masses, best_score, best_id, PIVOTS)
    _judge(top_ks, top_ps, min_ps, floats_stride, ints_stride, part_a, part_b, pivot_a,
           pivot_b, score, ident, ywin, floors, judged, tokens, arrivals, racing,
           num_racing, top, row, STEP, num_rows, num_chunks, SPAN, PIVOTS, PIVOTS_FROM, LAST)


@triton.jit
def _round_one_kernel(logits, stride, temperatures, top_ks, top_ps, min_ps, seeds, indices,
                      floats_stride, ints_stride, tops, part_a, part_b, pivot_a, pivot_b, score,
                      ident, ywin, floors, judged, tokens, failures, arrivals, racing,
                      num_racing,
                      rounds, num_rows, vocab, num_chunks, CHUNK: tl.constexpr,
                      BLOCK: tl.constexpr, SPAN: tl.constexpr, PIVOTS: tl.constexpr,
                      PIVOTS_FROM: tl.constexpr, LAST: tl.constexpr, FAST: tl.constexpr,
                      USE_PDL: tl.constexpr):
    """Round 1 over a (rows, chunks) grid: every sampled row not failed; the winner it judges
    is kept with probability about top_p, so later rounds take few (the ones its judges
    list)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    pdl_wait_then_release(USE_PDL)
    if (row == 0) & (chunk == 0) & (rounds >= 3):
        tl.store(num_racing + 3, 0)
    if (tl.load(temperatures + row * floats_stride) > 0) & (tl.load(failures + row) == 0):
        _round(row, chunk, logits, stride, temperatures, top_ks, top_ps, min_ps, seeds, indices,
               floats_stride, ints_stride, tops, part_a, part_b, pivot_a, pivot_b, score, ident,
               ywin, floors, judged, tokens, arrivals, racing, num_racing, num_rows,
               vocab, num_chunks, CHUNK, BLOCK, SPAN, PIVOTS, PIVOTS_FROM, 1, LAST, FAST)


@triton.jit
def _round_kernel(logits, stride, temperatures, top_ks, top_ps, min_ps, seeds, indices,
                  floats_stride, ints_stride, tops, part_a, part_b, pivot_a, pivot_b, score,
                  ident, ywin, floors, judged, tokens, failures, arrivals, racing, num_racing,
                  rounds, num_rows, vocab, num_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                  SPAN: tl.constexpr, PIVOTS: tl.constexpr, PIVOTS_FROM: tl.constexpr,
                  STEP: tl.constexpr, LAST: tl.constexpr, FAST: tl.constexpr,
                  USE_PDL: tl.constexpr):
    """Round STEP (2..ROUNDS) over the (row, chunk) items of the rows round STEP - 1's judges
    listed, strided over a grid of a few programs an SM: most draws list no row after round
    2, and a (rows, chunks) grid of programs that return at once took ~5.7 us a round at 64
    rows (their registers let 2 programs an SM in, so 15 waves of them). The LAST round's
    judge writes every undecided row's token. STEP is a constant: each round compiles its own
    judge. Its program 0 zeroes round STEP + 2's count, which round STEP + 1's judges raise."""
    program = tl.program_id(0)
    pdl_wait_then_release(USE_PDL)
    if (program == 0) & (rounds >= STEP + 2):
        tl.store(num_racing + STEP + 2, 0)
    item = program
    num_items = tl.load(num_racing + STEP) * num_chunks
    while item < num_items:  # not a range: the interpreter's wants Python ints
        row = tl.load(racing + STEP * num_rows + item // num_chunks)
        _round(row, item % num_chunks, logits, stride, temperatures, top_ks, top_ps, min_ps,
               seeds, indices, floats_stride, ints_stride, tops, part_a, part_b, pivot_a,
               pivot_b, score, ident, ywin, floors, judged, tokens, arrivals, racing,
               num_racing, num_rows, vocab, num_chunks, CHUNK, BLOCK, SPAN, PIVOTS,
               PIVOTS_FROM, STEP, LAST, FAST)
        item += tl.num_programs(0)


def launch_sizes(vocab: int) -> tuple[int, int, int]:
    """(CHUNK, BLOCK, SPAN) for a vocabulary: ids a program scans, ids a loop step loads,
    the partials' reduction width. A round over the rows still racing takes as long as one
    program's chunk, a loop step at a time: half gumbel_race's chunk (tests/gpu/time_draw.py
    sweeps the sizes)."""
    chunk = min(MAX_CHUNK // 2, triton.next_power_of_2(vocab))
    return chunk, min(MAX_BLOCK, chunk), triton.next_power_of_2(triton.cdiv(vocab, chunk))


@functools.cache
def _num_sms(device: torch.device) -> int:
    """The device's SMs (the interpreter's: 1, so a late round's programs loop over its list)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _common_stride(*columns: torch.Tensor) -> int:
    """The row stride the kernels read these [rows] parameters with (columns of one block, as
    engine/sampling_state.py keeps them, or contiguous tensors)."""
    strides = {column.stride(0) for column in columns}
    if len(strides) != 1:
        raise ValueError(f"sampling parameters of one dtype need one row stride, got {strides}")
    return strides.pop()


def nucleus_race(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, min_p: torch.Tensor, seed: torch.Tensor,
                 index: torch.Tensor, greedy: torch.Tensor, rounds: int = ROUNDS,
                 meeting: KeptZeros | None = None,
                 out: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: bool = False,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [rows, vocab] (a float dtype, unit stride along the vocabulary); per row
    ([rows] each, draw.RowParams' dtypes and order; each dtype's with one row stride):
    temperature (<= 0: greedy), top_k, top_p, min_p,
    seed, index; greedy: [rows] int64, the rows' argmax as torch.argmax gives it (a NaN counts
    as the largest): the race reads each row's top there. Returns ([rows] int64 tokens, [rows]
    bool failed). Static grids, temporaries only: a CUDA graph can hold it. meeting: where
    the judges' arrival counters are kept, zero between draws (each judge leaves its own at 0),
    so a draw clears none; without it they are zero-filled every draw. out: the ([rows] int64,
    [rows] bool) to write the tokens and failures into (contiguous each), else new ones. pdl:
    each kernel launched with programmatic dependent launch (kernels/pdl.py), so its launch
    overlaps the tail of the one before: the late rounds, which most draws leave empty, cost
    little more than their launch (~1.7 us each on the H200 without it)."""
    if logits.stride(1) != 1:
        raise ValueError("logits must be contiguous along the vocabulary")
    if rounds < 2:
        raise ValueError(f"rounds must be >= 2 (round 1 judges, it races nothing), got {rounds}")
    num_rows, vocab = logits.shape
    chunk, block, span = launch_sizes(vocab)
    num_chunks = triton.cdiv(vocab, chunk)
    device = logits.device

    def planes(dtype: torch.dtype) -> torch.Tensor:  # [rounds + 1, rows, chunks]: a pass each
        return torch.empty(rounds + 1, num_rows, num_chunks, dtype=dtype, device=device)

    part_a, part_b, score, ywin = (planes(torch.float32) for _ in range(4))
    ident = planes(torch.int64)
    pivot_a, pivot_b = (torch.empty(rounds + 1, num_rows, num_chunks, PIVOTS, device=device)
                        for _ in range(2))
    # [rounds + 1, rows]: pass s's floor and candidate, set by pass s - 1's judge
    floors = torch.empty(rounds + 1, num_rows, dtype=torch.float32, device=device)
    judged = torch.empty(rounds + 1, num_rows, dtype=torch.int64, device=device)
    arrivals = torch.zeros(rounds + 1, num_rows, dtype=torch.int32, device=device) \
        if meeting is None else meeting.get((rounds + 1, num_rows), torch.int32, device)
    tokens, failed = out if out is not None else (
        torch.empty(num_rows, dtype=torch.int64, device=device),
        torch.empty(num_rows, dtype=torch.bool, device=device))
    strides = (_common_stride(temperature, top_p, min_p), _common_stride(top_k, seed, index))
    limits = (temperature, top_k, top_p, min_p)
    tops = torch.empty(num_rows, dtype=torch.float32, device=device)
    passes = (tops, part_a, part_b, pivot_a, pivot_b, score, ident, ywin)
    state = (floors, judged, tokens, failed)
    grid = (num_rows, num_chunks)
    sizes = {"CHUNK": chunk, "BLOCK": block, "SPAN": span, "PIVOTS": PIVOTS,
             "PIVOTS_FROM": PIVOTS_FROM, "FAST": logits.is_cuda, **launch_options(pdl)}
    # [rounds + 1, rows]: the rows round s takes from 2 on, listed by round s - 1's judges, and
    # [rounds + 1] their counts; the kernels zero each count before its judges raise it
    racing = torch.empty(rounds + 1, num_rows, dtype=torch.int32, device=device)
    num_racing = torch.empty(rounds + 1, dtype=torch.int32, device=device)
    lists = (arrivals, racing, num_racing)
    _first_kernel[grid](logits, logits.stride(0), *limits, seed, index, *strides, greedy,
                        *passes, *state, *lists, num_rows, vocab, num_chunks, **sizes)
    args = (logits, logits.stride(0), *limits, seed, index, *strides, *passes, *state, *lists,
            rounds, num_rows, vocab, num_chunks)
    _round_one_kernel[grid](*args, LAST=False, **sizes)
    late_grid = (min(num_rows * num_chunks, LATE_PROGRAMS_AN_SM * _num_sms(device)),)
    for step in range(2, rounds + 1):
        _round_kernel[late_grid](*args, STEP=step, LAST=step == rounds, **sizes)
    return tokens, failed
