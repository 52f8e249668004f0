"""SlotCache: which request holds which row of the planner's store, in plain Python.

Slots are a cache: 2 * B + 1 rows (B the widest decode bucket), row 0 the sink and 2 * B for
requests. A step's rows are at most B, and besides them only the rows of the one earlier plan
that may not have committed are out of reach, so displacing the least recently run request
always finds a victim. (This engine plans a step only after the previous one's host commit, so
the second B is headroom it does not reach; the bound holds for any overlap.) A displaced
request takes a fresh slot and a whole-row write when it next runs, as a new request does. A
freed slot returns only after the commit of the last step that read it, since that commit still
advances the slot's host mirror.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from resident.planner.layout import SINK_ROW


@dataclass
class ResidentPlan:
    """One resident step: its rows' slots (padded to the bucket with the sink) and the requests
    that took a slot in it (written whole by the flush)."""

    seq: int
    request_ids: list[str]
    slot_ids: list[int]  # [bucket]
    new_slots: list[str]
    previous_reads: dict[int, int] = field(default_factory=dict)  # slot -> last_read before
    state: str = "planned"  # planned -> flushed -> committed, or abandoned

    @property
    def row_slots(self) -> list[int]:
        """The slots of the step's rows, without the bucket's padding."""
        return self.slot_ids[:len(self.request_ids)]


@dataclass
class _Slot:
    owner: str | None = None
    last_read: int = -1  # seq of the last plan that read this slot
    taken: int = -1  # order in which the owner took it (ties in displacement)


class SlotCache:
    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self._slots = [_Slot() for _ in range(num_rows)]
        self._slot_of: dict[str, int] = {}
        self._free: deque[int] = deque(range(1, num_rows))
        self._cooling: dict[int, int] = {}  # slot -> seq whose commit frees it
        self._stale: set[str] = set()
        self._outstanding: dict[int, ResidentPlan] = {}
        self._seqs = itertools.count(1)
        self._takes = itertools.count()
        self.committed_seq = 0
        # slot_releases: offloads that gave a slot up; slots_freed: finished or aborted requests
        self.counters = {"displaced": 0, "slot_releases": 0, "offloads_without_slot": 0,
                         "slots_freed": 0}

    def plan(self, request_ids: list[str], bucket: int) -> ResidentPlan:
        """Gives every row a slot, displacing least recently run requests outside the step and
        outside any uncommitted step. Changes nothing if it raises."""
        seq = next(self._seqs)
        missing = [rid for rid in request_ids if rid not in self._slot_of]
        new_slots = self._take_slots(missing, set(request_ids)) if missing else []
        slot_ids = [self._slot_of[rid] for rid in request_ids]
        previous = {slot: self._slots[slot].last_read for slot in slot_ids}
        for slot in slot_ids:
            self._slots[slot].last_read = seq
        plan = ResidentPlan(seq, list(request_ids),
                            slot_ids + [SINK_ROW] * (bucket - len(slot_ids)), new_slots,
                            previous)
        self._outstanding[seq] = plan
        return plan

    def _take_slots(self, missing: list[str], in_step: set[str]) -> list[str]:
        """Free slots, then displaced ones, for the rows that hold none; checks that every row
        gets one before it changes anything."""
        free = list(self._free)
        displaced, taken = [], {}
        for rid in missing:
            slot = free.pop(0) if free else self._victim(in_step, displaced)
            if slot is None:
                raise RuntimeError("no slot to displace: more rows in flight than 2 * B")
            taken[rid] = slot
        for slot in displaced:
            self._drop_owner(slot)
            self.counters["displaced"] += 1
        for rid, slot in taken.items():
            if slot in self._free:
                self._free.remove(slot)
            self._slots[slot] = _Slot(owner=rid, taken=next(self._takes))
            self._slot_of[rid] = slot
        return missing

    def _victim(self, in_step: set[str], chosen: list[int]) -> int | None:
        reachable = [
            slot for slot, info in enumerate(self._slots)
            if info.owner is not None and info.owner not in in_step and slot not in chosen
            and not self._read_by_uncommitted(slot)
        ]
        if not reachable:
            return None
        victim = min(reachable, key=lambda s: (self._slots[s].last_read, self._slots[s].taken))
        chosen.append(victim)
        return victim

    def _read_by_uncommitted(self, slot: int) -> bool:
        last = self._slots[slot].last_read
        plan = self._outstanding.get(last)
        return last > self.committed_seq and plan is not None and plan.state != "abandoned"

    def _drop_owner(self, slot: int) -> None:
        owner = self._slots[slot].owner
        if owner is not None:
            del self._slot_of[owner]
            self._stale.discard(owner)
        self._slots[slot].owner = None

    def whole_rows(self, plan: ResidentPlan) -> set[str]:
        """The plan's requests whose rows are written whole (new or stale); they are not stale
        after this."""
        if not plan.new_slots and not self._stale:
            return set()
        whole = set(plan.new_slots) | (self._stale & set(plan.request_ids))
        self._stale -= whole
        return whole

    def committed(self, plan: ResidentPlan) -> None:
        self.committed_seq = max(self.committed_seq, plan.seq)
        del self._outstanding[plan.seq]
        if self._cooling:
            self._return_cooled()

    def abandon(self, plan: ResidentPlan) -> None:
        """A plan that will not run (never flushed): its new slots go back unread."""
        del self._outstanding[plan.seq]
        for slot, last_read in plan.previous_reads.items():  # an earlier reader may be in flight
            if self._slots[slot].last_read == plan.seq:
                self._slots[slot].last_read = last_read
            if self._cooling.get(slot) == plan.seq:
                self._cooling[slot] = last_read
        for rid in plan.new_slots:
            slot = self._slot_of.get(rid)
            if slot is not None:
                self._drop_owner(slot)
                self._free.append(slot)
        self._return_cooled()

    def release(self, request_id: str, offload: bool = False) -> None:
        """A request finished, was aborted or offloaded: its slot cools until the last step
        that read it commits."""
        slot = self._slot_of.get(request_id)
        if slot is None:
            if offload:
                self.counters["offloads_without_slot"] += 1
            return
        self._drop_owner(slot)
        self.counters["slot_releases" if offload else "slots_freed"] += 1
        if self._read_by_uncommitted(slot):
            self._cooling[slot] = self._slots[slot].last_read
        else:
            self._free.append(slot)

    def mark_stale(self, request_ids) -> None:
        """A host-planned step moved these streams: their rows are written whole next time."""
        self._stale.update(rid for rid in request_ids if rid in self._slot_of)

    def _return_cooled(self) -> None:
        for slot, seq in list(self._cooling.items()):
            plan = self._outstanding.get(seq)
            if seq <= self.committed_seq or plan is None:
                del self._cooling[slot]
                self._free.append(slot)

    def slot_of(self, request_id: str) -> int | None:
        return self._slot_of.get(request_id)

    def holders(self) -> dict[str, int]:
        """Request id -> the slot it holds."""
        return dict(self._slot_of)

    def ledger(self) -> dict[str, set[int]]:
        """Every slot but the sink is exactly one of free, cooling or held."""
        return {"free": set(self._free), "cooling": set(self._cooling),
                "held": set(self._slot_of.values())}
