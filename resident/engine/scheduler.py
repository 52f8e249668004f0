"""Scheduler: continuous batching over the resource pools, in plain Python (no torch).

Each step takes decode rows (at most the widest decode bucket, ordered by `decode_order`), then
prefill chunks of running and then waiting requests under `prefill_token_budget` (at most
`max_prefill_rows` of them); both kinds may share a step, decode rows first. Under KV pressure a
running request that needs a page offloads the coldest running request outside the step (its
pages and state go to host memory through the `Swapper`); offloaded requests reload, oldest
first, when room returns, and new requests wait until none is offloaded.
A request whose prompt and output could never fit the pool fails alone at arrival.
With the prefix cache on (engine/prefix.py), a new request starts from its longest cached
prefix (its pages shared, its GDN state restored) and prefill chunks end at snapshot points;
cached pages no request holds count as free and give way to KV pressure.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from resident.config import EngineConfig
from resident.engine.prefix import NoPrefixCache
from resident.engine.request import Request, Status
from resident.resources.kv import KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import StatePool


class Swapper(Protocol):
    """Moves a request's device state (engine/swap.py's StateSwapper). The scheduler owns the
    pools: it frees after `offload` and hands out pages and a slot before `reload`."""

    def offload(self, request: Request) -> None: ...  # copy its pages and slot to host memory

    def reload(self, request: Request) -> None: ...  # copy them back into its new pages and slot

    def reset_state(self, request: Request) -> None: ...  # zero a fresh request's state slot


@dataclass(slots=True)
class Row:
    """One row of a step, never changed once made. Not frozen: a step makes one a running
    request (256 at c=256), and a frozen dataclass's __init__ costs 2.5x (a NamedTuple's
    fields read 2x slower, and every stage of the step reads them)."""

    request: Request
    num_new: int  # tokens this row feeds
    samples: bool  # whether the row samples a token (a decode row or a prompt's last chunk)


@dataclass(frozen=True)
class StepPlan:
    """A step's rows: decode rows first (one token each), then prefill chunks."""

    rows: list[Row]
    kind: str  # decode | prefill | mixed
    # the requests of the rows that sample, in row order (each decode row's, then each prompt
    # whose last chunk this is): what sampling, commit and emit walk. Made by the scheduler,
    # which holds the decode rows' requests as a list already: built again from the rows it
    # cost every decode step ~1.4 us at c=64 on the VM, charged to the sampler's phase
    sampling: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(row.num_new for row in self.rows)

    @functools.cached_property
    def num_decode_rows(self) -> int:
        """The leading rows that decode (their request's prompt is computed); counted once,
        before the step's commit moves any prompt on."""
        count = 0
        while count < len(self.rows) and not self.rows[count].request.is_prefilling:
            count += 1
        return count


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVPool, states: StatePool,
                 positions: Positions, swapper: Swapper,
                 prefixes: NoPrefixCache | None = None) -> None:
        self.config = config
        self.kv, self.states, self.positions = kv, states, positions
        self.swapper = swapper
        self.prefixes = prefixes or NoPrefixCache()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.offloaded: deque[Request] = deque()
        self.step_number = 0
        self.num_offloads = 0
        self.num_reloads = 0

    # -- intake -----------------------------------------------------------------------------

    def never_fits(self, request: Request) -> str | None:
        if request.max_total_tokens > self.config.max_model_len:
            return (f"request can never fit: {request.max_total_tokens} tokens exceed "
                    f"max_model_len {self.config.max_model_len}")
        if self.kv.pages_for(request.max_total_tokens) > self.kv.num_pages - 1:
            return (f"request can never fit: {request.max_total_tokens} tokens need "
                    f"{self.kv.pages_for(request.max_total_tokens)} KV pages, the pool has "
                    f"{self.kv.num_pages - 1}")
        return None

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.offloaded)

    def could_admit(self) -> bool:
        """Whether a request arriving now could start in the next step: none waits before it,
        none is offloaded and a sequence is free (its pages are not checked)."""
        return not self.waiting and not self.offloaded \
            and len(self.running) < self.config.max_num_seqs

    def release(self, request: Request) -> None:
        """Takes a finished or aborted request out, giving back what it holds."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self._free(request)
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        elif request.status is Status.OFFLOADED:
            self.offloaded.remove(request)
        request.status = Status.FINISHED

    # -- one step ---------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        self.step_number += 1
        self._reload()
        rows: list[Row] = []
        sampling = self._add_decode_rows(rows)
        num_decode = len(rows)
        budget = self.config.prefill_token_budget
        budget = self._add_prefill_rows(rows, budget, self._running_prefills())
        self._admit_waiting(rows, budget)
        for row in rows:
            row.request.last_run_step = self.step_number
        if len(rows) > num_decode:
            sampling = sampling + [row.request for row in rows[num_decode:] if row.samples]
        return StepPlan(rows, _kind(num_decode, len(rows)), sampling)

    def _add_decode_rows(self, rows: list[Row]) -> list[Request]:
        """Adds the decode rows to the (empty) rows; returns their requests, in row order."""
        ready = [r for r in self.running if r.is_decode_ready]
        if self.config.decode_order == "turns":
            ready.sort(key=lambda r: (r.last_run_step, r.arrival))
        else:
            ready.sort(key=lambda r: r.arrival)
        widest = self.config.max_decode_rows
        turned_away = False
        for request in ready:
            if len(rows) == widest:
                break
            if self._admit_running(request, 1, rows):
                rows.append(Row(request, 1, samples=True))
            else:
                turned_away = True
        return [row.request for row in rows] if turned_away else ready[:len(rows)]

    def _running_prefills(self) -> list[Request]:
        return sorted((r for r in self.running if r.is_prefilling), key=lambda r: r.arrival)

    def _add_prefill_rows(self, rows: list[Row], budget: int,
                          requests: Iterable[Request]) -> int:
        for request in requests:
            if budget == 0 or self._prefill_rows_full(rows):
                break
            start = request.num_computed
            chunk = self.prefixes.chunk(request, start,
                                        min(len(request.prompt_ids) - start, budget))
            if self._admit_running(request, chunk, rows):
                rows.append(_prefill_row(request, chunk))
                budget -= chunk
        return budget

    def _admit_waiting(self, rows: list[Row], budget: int) -> None:
        """New requests take what is free, in arrival order, and never displace anyone; none
        starts while an offloaded request waits to come back."""
        while self.waiting and budget > 0 and not self.offloaded:
            if len(self.running) >= self.config.max_num_seqs or self._prefill_rows_full(rows):
                return
            request = self.waiting[0]
            hit = self.prefixes.match(request)
            start, pages = (hit.num_tokens, hit.pages) if hit else (0, [])
            chunk = self.prefixes.chunk(request, start,
                                        min(len(request.prompt_ids) - start, budget))
            # the hit's idle pages stop counting as free once its stream holds them
            need = self.kv.pages_for(start + chunk) - len(pages)
            if need + self.kv.cache.num_idle_of(pages) > self.kv.num_free:
                return
            if self.states.admit(request.request_id, chunk) is not None:
                return
            if hit:
                self.kv.share(request.request_id, pages)
                request.num_computed = start
            self.kv.admit(request.request_id, chunk)
            self.positions.admit(request.request_id, chunk)
            if hit:
                self.prefixes.restore(request, hit)
            else:
                self.swapper.reset_state(request)
            self.waiting.popleft()
            request.status = Status.RUNNING
            request.admitted_s = time.monotonic()
            self.running.append(request)
            rows.append(_prefill_row(request, chunk))
            budget -= chunk

    def _prefill_rows_full(self, rows: list[Row]) -> bool:
        return sum(row.request.is_prefilling for row in rows) >= self.config.max_prefill_rows

    def _admit_running(self, request: Request, num_new: int, rows: list[Row]) -> bool:
        """Reserves pages for a running request's next tokens, offloading the coldest running
        requests outside the step while it does not fit. False leaves the row for later (as for
        a request this step's earlier rows offloaded)."""
        if request.status is not Status.RUNNING:
            return False
        while self.kv.admit(request.request_id, num_new) is not None:
            in_step = {id(row.request) for row in rows} | {id(request)}
            victims = [r for r in self.running  # a finished one is released after its step
                       if id(r) not in in_step and r.finish_reason is None]
            if not victims:
                return False
            self._offload(min(victims, key=lambda r: (r.last_run_step, -r.arrival)))
        return True

    def _offload(self, request: Request) -> None:
        self.swapper.offload(request)
        self.running.remove(request)
        self._free(request)
        request.status = Status.OFFLOADED
        self.offloaded.append(request)
        self.num_offloads += 1

    def _reload(self) -> None:
        """Brings offloaded requests back, oldest first, while the pool keeps a page of headroom
        for every running request."""
        while self.offloaded and len(self.running) < self.config.max_num_seqs:
            request = self.offloaded[0]
            need = self.kv.pages_for(request.num_computed + 1)
            if need + len(self.running) > self.kv.num_free or not self.states.num_free:
                return
            self.offloaded.popleft()
            self.kv.restore(request.request_id, request.num_computed)
            self.states.admit(request.request_id, 0)
            self.positions.admit(request.request_id, 0)
            self.swapper.reload(request)
            request.status = Status.RUNNING
            self.running.append(request)
            self.num_reloads += 1

    def _free(self, request: Request) -> None:
        self.kv.free(request.request_id)
        self.states.free(request.request_id)
        self.positions.free(request.request_id)


def _prefill_row(request: Request, chunk: int) -> Row:
    return Row(request, chunk, samples=request.num_computed + chunk == len(request.prompt_ids))


def _kind(num_decode: int, num_rows: int) -> str:
    """decode rows come first, every row after them a prompt chunk"""
    if num_decode == num_rows:
        return "decode"
    return "mixed" if num_decode else "prefill"
