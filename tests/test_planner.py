"""ResidentPlanner on CPU: the slot cache, displacement, staging, overlapped plans, several pools.

A simulated engine drives real pools and the planner, runs the resident ops (scatter, gather,
advance) on the CPU tables in place of the captured graph, and checks what every step read
against the host streams.
"""

from __future__ import annotations

import random

import pytest
import torch

from resident.config import EngineConfig
from resident.engine.planning import planner_refusal
from resident.kernels.resident import advance_lengths_ref, gather_rows_ref, scatter_cells_ref
from resident.planner import SINK_ROW, ResidentPlanner
from resident.resources.base import Resource
from resident.resources.kv import KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import StatePool

PAGE = 4
SPAN = 32


class Sim:
    """Pools, a planner and the resident ops; `step` runs one resident decode step in order,
    `pre_plan`/`abandon` exercise the overlapped order."""

    def __init__(self, max_bucket: int = 4, read_only_pool: bool = False):
        self.kv = KVPool(2048, PAGE)
        self.ctx = KVPool(512, PAGE) if read_only_pool else None
        self.states = StatePool(512)
        self.positions = Positions()
        pools = {"kv": (self.kv, SPAN, True)}
        if self.ctx:
            pools["ctx"] = (self.ctx, 8, False)
        self.planner = ResidentPlanner(max_bucket, pools, self.states, self.positions, "kv",
                                       torch.device("cpu"))
        self.max_bucket = max_bucket
        self.read_seq: dict[str, int] = {}
        self.rows_read = 0

    def start(self, rid: str, prompt_len: int, offset: int = 0) -> None:
        """A request whose prompt a host step prefilled, its positions from `offset`."""
        self.states.admit(rid, prompt_len)
        self.positions.admit(rid, prompt_len, offset)
        self.kv.admit(rid, prompt_len)
        self.kv.commit(rid, prompt_len)
        if self.ctx:
            self.ctx.admit(rid, 6)
            self.ctx.commit(rid, 6)
        self.planner.mark_stale([rid])

    def host_step(self, rids: list[str], num_tokens: int, context_tokens: int = 0) -> None:
        """A host-planned (mixed) step advanced these streams (and the read-only pool's)."""
        for rid in rids:
            self.kv.admit(rid, num_tokens)
            self.kv.commit(rid, num_tokens)
            if context_tokens:
                self.ctx.admit(rid, context_tokens)
                self.ctx.commit(rid, context_tokens)
        self.planner.mark_stale(rids)

    def staged_cells(self) -> list[list[int]]:
        """The (slot, column, value) cells the last flush staged (trash entries left out)."""
        return [c for c in self.planner.cells_gpu.tolist() if c[0] != SINK_ROW]

    def finish(self, rid: str, offload: bool = False) -> None:
        self.planner.release(rid, offload=offload)
        for resource in (self.kv, self.states, self.positions, self.ctx):
            if resource:
                resource.free(rid)

    def plan(self, rids: list[str]):
        return self.planner.plan(rids, self.max_bucket)

    def run(self, plan) -> None:
        """Admit, flush, run the ops and check every row the step read; then commit."""
        for rid in plan.request_ids:
            assert self.kv.admit(rid, 1) is None
        staged = self.planner.flush(plan)
        store = self.planner.store_gpu
        layout = self.planner.layout
        pool = layout.pool("kv")
        bucket = len(plan.slot_ids)
        out = {name: torch.zeros(bucket, dtype=torch.int64) for name in
               ("positions", "write_loc", "state_slots")}
        tables = torch.zeros(bucket, staged.width, dtype=torch.int64)
        scatter_cells_ref(store, staged.cells_gpu)
        gather_rows_ref(store, staged.slot_ids_gpu, pool.length_col, layout.offset_col,
                        layout.state_col, pool.span_start, staged.width, PAGE, tables,
                        out["positions"], out["write_loc"], out["state_slots"])
        for index, rid in enumerate(plan.request_ids):
            stream = self.kv.streams[rid]
            length = stream.length
            assert out["positions"][index] == self.positions.offsets[rid] + length, rid
            assert out["write_loc"][index] == self.kv.write_location(rid, length), rid
            assert tables[index, :len(stream.pages)].tolist() == stream.pages, rid
            assert out["state_slots"][index] == self.states.slots[rid], rid
            if self.ctx:
                ctx = layout.pool("ctx")
                row = store[plan.slot_ids[index]]
                assert row[ctx.length_col] == self.ctx.streams[rid].length
                pages = self.ctx.streams[rid].pages
                assert row[ctx.span_start:ctx.span_start + len(pages)].tolist() == pages
            self.read_seq[rid] = plan.seq
        self.rows_read += len(plan.request_ids)
        advance_lengths_ref(store, staged.slot_ids_gpu,
                            [p.length_col for p in layout.pools if p.appends])
        assert store[SINK_ROW].tolist() == self.planner.sink_row().tolist()

    def commit(self, plan) -> None:
        for rid in plan.request_ids:
            self.kv.commit(rid, 1)
        self.planner.commit(plan)

    def check_ledger(self) -> None:
        ledger = self.planner.ledger()
        slots = set(range(1, self.planner.num_rows))
        assert ledger["free"] | ledger["cooling"] | ledger["held"] == slots
        assert sum(len(part) for part in ledger.values()) == len(slots)


def holders(sim: Sim) -> dict[str, int]:
    return sim.planner.slots.holders()


def test_more_live_requests_than_slots_run_off_the_cache():
    for seed in range(4):
        _turns_over_the_cache(seed)


def _turns_over_the_cache(seed: int) -> None:
    rng = random.Random(seed)
    sim = Sim(max_bucket=4)
    handles = [f"h{i}" for i in range(20)]
    for rid in handles:
        sim.start(rid, rng.randrange(1, 40))
    previous = None  # the flushed plan not yet committed
    displaced_seen = 0
    for _ in range(300):
        live = list(sim.kv.streams)
        rows = sorted(rng.sample(live, rng.randint(1, 4)),
                      key=lambda r: sim.read_seq.get(r, -1))
        behind = set(previous.request_ids) if previous else set()
        before = holders(sim)
        plan = sim.plan(rows)
        lost = [r for r in before if r not in holders(sim)]
        _check_victims(sim, lost, before, set(rows), behind)
        displaced_seen += len(lost)
        if rng.random() < 0.15:  # an abandoned pre-plan
            sim.planner.abandon(plan)
            assert not set(plan.new_slots) & set(holders(sim))
            sim.check_ledger()
            continue
        if previous:
            sim.commit(previous)
        sim.run(plan)
        previous = plan
        sim.check_ledger()
        if rng.random() < 0.1:  # a host-planned mixed step over some live requests
            sim.commit(previous)
            previous = None
            sim.host_step(rng.sample(list(sim.kv.streams), 2), rng.randrange(1, 9))
        if rng.random() < 0.1:  # a teardown, and the handle comes back as a new request
            done = rng.choice([r for r in sim.kv.streams if r not in plan.request_ids])
            sim.finish(done)
            sim.start(done, rng.randrange(1, 20))
        sim.check_ledger()
    if previous:
        sim.commit(previous)
    sim.check_ledger()
    assert displaced_seen > 0 and sim.planner.counters["displaced"] == displaced_seen


def _check_victims(sim: Sim, lost: list[str], before: dict[str, int], in_step: set[str],
                   behind: set[str]) -> None:
    """Victims are outside the step and the step behind, and no request they passed over was
    read less recently."""
    eligible = [r for r in before if r not in in_step and r not in behind]
    for victim in lost:
        assert victim in eligible
        kept = [r for r in eligible if r not in lost]
        assert all(sim.read_seq.get(r, -1) >= sim.read_seq.get(victim, -1) for r in kept)


def test_a_displaced_row_is_written_whole_with_its_lengths():
    sim = Sim(max_bucket=1)
    for rid in ("a", "b", "c"):
        sim.start(rid, 5)
    for rid in ("a", "b", "c"):  # three requests over two slots: c displaces a
        plan = sim.plan([rid])
        sim.run(plan)
        sim.commit(plan)
    assert sim.planner.slot_of("a") is None and sim.planner.counters["displaced"] == 1
    sim.host_step(["a"], 3)
    plan = sim.plan(["a"])
    assert plan.new_slots == ["a"]
    sim.run(plan)  # checks a's length (5 + 1 + 3) and pages on its fresh row
    sim.commit(plan)


def test_a_step_keeps_its_rows_and_the_step_behind():
    sim = Sim(max_bucket=2)
    for rid in "abcd":
        sim.start(rid, 3)
    first = sim.plan(["a", "b"])
    sim.run(first)
    second = sim.plan(["c", "d"])  # pre-planned before `first` commits: 4 slots, all taken
    assert {sim.planner.slot_of(r) for r in "abcd"} == {1, 2, 3, 4}
    sim.commit(first)
    sim.run(second)
    sim.start("e", 2)
    third = sim.plan(["c", "e"])  # `second` is behind and uncommitted: only a or b may go
    assert sim.planner.slot_of("c") and sim.planner.slot_of("d")
    assert sim.planner.slot_of("a") is None and sim.planner.slot_of("b") is not None
    sim.commit(second)
    sim.run(third)
    sim.commit(third)


def test_a_victim_leaves_no_marks():
    sim = Sim(max_bucket=1)
    for rid, length in (("a", 30), ("b", 9), ("c", 2)):
        sim.start(rid, length)
    for rid in "ab":
        plan = sim.plan([rid])
        sim.run(plan)
        sim.commit(plan)
    slot_a = sim.planner.slot_of("a")
    plan = sim.plan(["c"])  # takes a's slot
    assert sim.planner.slot_of("c") == slot_a
    sim.run(plan)  # c's row is checked cell by cell: nothing of a's stays
    sim.commit(plan)
    row = sim.planner.store_gpu[slot_a].numpy()
    assert (row == sim.planner.stager.host_row("c")[0]).all()  # a's 8 pages are gone


def test_plans_that_never_ran_hold_no_slots():
    sim = Sim(max_bucket=2)
    for rid in "ab":
        sim.start(rid, 2)
    plan = sim.plan(["a", "b"])
    sim.planner.abandon(plan)
    assert sim.planner.ledger()["held"] == set()
    sim.check_ledger()


def test_a_plan_that_raises_leaves_its_rows_to_the_next_step():
    sim = Sim(max_bucket=1)
    for rid in "abc":
        sim.start(rid, 2)
    first = sim.plan(["a"])
    sim.run(first)
    second = sim.plan(["b"])  # two slots now held, the first plan uncommitted
    with pytest.raises(RuntimeError, match="no slot to displace"):
        sim.planner.plan(["c"], 1)  # a is in flight behind, b's plan outstanding
    assert sim.planner.slot_of("c") is None
    sim.check_ledger()
    sim.commit(first)
    sim.run(second)
    sim.commit(second)
    third = sim.plan(["c"])
    assert third.new_slots == ["c"]
    sim.run(third)
    sim.commit(third)


def test_an_abandoned_plan_stages_nothing_and_the_retry_names_the_page_it_gets():
    """A plan abandoned before its flush leaves no stage behind: the retry's flush reads the
    stream as it is then, so its crossing names the page the stream holds, not the page the
    abandoned step would have taken (here another request took that one meanwhile)."""
    sim = Sim(max_bucket=1)
    sim.start("a", PAGE - 1)
    plan = sim.plan(["a"])
    sim.run(plan)
    sim.commit(plan)  # a's stream now fills its page: the next token crosses into a new one
    would_take = sim.kv.pages_needed("a", 1)
    pre = sim.plan(["a"])
    sim.planner.abandon(pre)
    sim.start("b", PAGE)  # b takes the page a's abandoned step would have crossed into
    assert would_take == 1
    retry = sim.plan(["a"])
    sim.run(retry)  # admits a fresh page; the stage must name it
    cells = sim.planner.cells_gpu.numpy()
    staged_pages = {int(v) for s, c, v in cells
                    if s != SINK_ROW and c >= sim.planner.layout.num_narrow}
    assert staged_pages == {sim.kv.streams["a"].pages[-1]}
    assert sim.kv.streams["a"].pages[-1] not in sim.kv.streams["b"].pages
    sim.commit(retry)


def test_an_offload_gives_the_slot_up_and_the_reload_is_written_whole():
    sim = Sim(max_bucket=2)
    for rid in "ab":
        sim.start(rid, 6)
    plan = sim.plan(["a", "b"])
    sim.run(plan)
    sim.commit(plan)
    length = sim.kv.streams["a"].length
    sim.finish("a", offload=True)
    assert sim.planner.counters["slot_releases"] == 1 and sim.planner.slot_of("a") is None
    sim.start("a", length)  # reloaded into fresh pages and a fresh GDN slot
    plan = sim.plan(["a", "b"])
    assert plan.new_slots == ["a"]
    sim.run(plan)
    sim.commit(plan)


def test_a_flush_of_the_largest_step_stages_without_growing():
    sim = Sim(max_bucket=8)
    rids = [f"r{i}" for i in range(16)]
    for rid in rids:
        sim.start(rid, PAGE)
    pointers = [t.data_ptr() for t in sim.planner.stager.buffers()]
    for group in (rids[:8], rids[8:], rids[:8]):  # whole rows, then displacement, then again
        plan = sim.plan(group)
        sim.run(plan)
        sim.commit(plan)
    for rid in rids[:8]:  # refreshed length and offset, and a page crossing, on every row
        sim.kv.admit(rid, 2)
        sim.kv.commit(rid, 2)
        sim.positions.offsets[rid] += 1
    plan = sim.plan(rids[:8])
    sim.run(plan)
    staged = [c for c in sim.planner.cells_gpu.tolist() if c[0] != SINK_ROW]
    assert len(staged) == 8 * 3
    sim.commit(plan)
    assert [t.data_ptr() for t in sim.planner.stager.buffers()] == pointers


def test_two_planners_fed_the_same_history_displace_the_same_requests():
    histories = []
    for _ in range(2):
        rng = random.Random(11)
        sim = Sim(max_bucket=2)
        for i in range(9):
            sim.start(f"r{i}", rng.randrange(1, 10))
        slots = []
        for _ in range(60):
            plan = sim.plan(rng.sample(sorted(sim.kv.streams), 2))
            sim.run(plan)
            sim.commit(plan)
            slots.append(tuple(plan.slot_ids))
        histories.append((slots, sim.planner.counters["displaced"]))
    assert histories[0] == histories[1] and histories[0][1] > 0


def test_two_pools_one_read_only_keep_separate_tables_and_lengths():
    sim = Sim(max_bucket=2, read_only_pool=True)
    for rid in "ab":
        sim.start(rid, 3)
    layout = sim.planner.layout
    kv, ctx = layout.pool("kv"), layout.pool("ctx")
    assert kv.appends and not ctx.appends
    assert kv.span_start + kv.span == ctx.span_start
    for _ in range(6):
        plan = sim.plan(["a", "b"])
        sim.run(plan)  # checks both pools' cells on every row
        sim.commit(plan)
    row = sim.planner.store_gpu[sim.planner.slot_of("a")]
    assert row[kv.length_col] == 9 and row[ctx.length_col] == 6
    assert sim.planner.stager.mirror_cpu[sim.planner.slot_of("a"), ctx.length_col] == 6


def test_steady_decode_stages_only_page_crossings():
    """The host mirror advances by the device's rule, so nothing but crossings is re-sent."""
    sim = Sim(max_bucket=1)
    sim.start("a", 1)
    staged_per_step = []
    for _ in range(3 * PAGE):
        plan = sim.plan(["a"])
        sim.run(plan)
        staged_per_step.append(
            [c for c in sim.planner.cells_gpu.tolist() if c[0] != SINK_ROW])
        sim.commit(plan)
    # step 0 writes the row whole; the token at position p crosses when p % PAGE == 0
    crossings = [i for i, cells in enumerate(staged_per_step) if cells]
    assert crossings == [i for i in range(1, 3 * PAGE) if (1 + i) % PAGE == 0]
    assert all(len(staged_per_step[i]) == 1 for i in crossings)


def test_a_freed_slot_returns_after_the_last_reader_commits():
    sim = Sim(max_bucket=1)
    sim.start("a", 3)
    plan = sim.plan(["a"])
    sim.run(plan)
    slot = sim.planner.slot_of("a")
    sim.finish("a")  # aborted while its step is still in flight
    assert slot in sim.planner.ledger()["cooling"]
    sim.check_ledger()
    sim.planner.commit(plan)
    assert slot in sim.planner.ledger()["free"]
    sim.check_ledger()


def test_a_host_step_leaves_the_row_to_be_written_whole():
    sim = Sim(max_bucket=1)
    sim.start("a", 3)
    plan = sim.plan(["a"])
    sim.run(plan)
    sim.commit(plan)
    sim.host_step(["a"], 2)  # a mixed step moved a's stream on the host
    whole = sim.planner.counters["rows_written_whole"]
    plan = sim.plan(["a"])
    sim.run(plan)
    sim.commit(plan)
    assert sim.planner.counters["rows_written_whole"] == whole + 1


def test_steady_multi_row_decode_stages_only_each_rows_page_crossings():
    """The diff-only promise on every row of a multi-row step: once each row is written, a
    step stages one cell per row that crossed into a new page and nothing else (a mirror that
    missed one row's advance would re-send that row's length every step)."""
    sim = Sim(max_bucket=4)
    rids = ["a", "b", "c", "d"]
    for index, rid in enumerate(rids):
        sim.start(rid, 3 + 5 * index)
    first = sim.plan(rids)
    sim.run(first)
    sim.commit(first)
    total_staged = total_crossings = 0
    for _ in range(40):
        pages_before = {rid: len(sim.kv.streams[rid].pages) for rid in rids}
        plan = sim.plan(rids)
        sim.run(plan)  # admits each row's token, crossing into a new page where it must
        crossed = [rid for rid in rids if len(sim.kv.streams[rid].pages) > pages_before[rid]]
        staged = sim.staged_cells()
        assert len(staged) == len(crossed)
        assert {cell[0] for cell in staged} == {sim.planner.slot_of(rid) for rid in crossed}
        sim.commit(plan)
        total_staged += len(staged)
        total_crossings += len(crossed)
    assert total_crossings >= 4 * (40 // PAGE) and total_staged == total_crossings
    assert sim.planner.counters["rows_written_whole"] == 4


def test_position_offsets_reach_the_gathered_positions():
    """Rows whose positions start at their own offset gather offset + stored length (Sim.run
    checks every row), through decode steps, a host step and an offset that changes."""
    sim = Sim(max_bucket=2)
    sim.start("a", 5, offset=0)
    sim.start("b", 9, offset=1000)
    for step in range(2 * PAGE):
        if step == PAGE:
            sim.host_step(["b"], 3)
            sim.positions.offsets["a"] = 40  # a refreshed narrow cell, staged as one cell
        plan = sim.plan(["a", "b"])
        sim.run(plan)
        if step == PAGE:
            offset_col = sim.planner.layout.offset_col
            assert [sim.planner.slot_of("a"), offset_col, 40] in sim.staged_cells()
        sim.commit(plan)
    row = sim.planner.store_gpu[sim.planner.slot_of("b")]
    assert row[sim.planner.layout.offset_col] == 1000


def test_a_read_only_pool_row_is_rewritten_only_when_a_host_step_moves_it():
    sim = Sim(max_bucket=2, read_only_pool=True)
    for rid in "ab":
        sim.start(rid, 3)
    ctx = sim.planner.layout.pool("ctx")
    for _ in range(PAGE):  # decode never touches the read-only pool's cells
        plan = sim.plan(["a", "b"])
        sim.run(plan)
        assert not [c for c in sim.staged_cells() if c[1] in
                    (ctx.length_col, *range(ctx.span_start, ctx.span_start + ctx.span))]
        sim.commit(plan)
    whole = sim.planner.counters["rows_written_whole"]
    sim.host_step(["a"], 1, context_tokens=PAGE)  # a host step moves a's context
    plan = sim.plan(["a", "b"])
    sim.run(plan)  # checks a's context pages and length on its rewritten row
    sim.commit(plan)
    assert sim.planner.counters["rows_written_whole"] == whole + 1
    assert sim.planner.store_gpu[sim.planner.slot_of("a"), ctx.length_col] == 6 + PAGE


def test_a_resource_without_a_table_keeps_planning_off():
    """The refusal list: any resource of the node that keeps no resident table turns the
    planner off, naming itself; the base Resource refuses, so a new one does by default."""

    class SlidingWindowKV(Resource):
        name = "sliding-window kv"

    pools = [KVPool(8, PAGE), StatePool(4), Positions()]
    assert planner_refusal(EngineConfig(), pools) is None
    assert planner_refusal(EngineConfig(), [*pools, SlidingWindowKV()]) == (
        "resource 'sliding-window kv' keeps no resident table: every step is host-planned")
    assert planner_refusal(EngineConfig(resident_planning="off"), pools).startswith(
        "resident_planning=off")
