"""The resident row: what one slot of the planner's store holds, cell by cell.

A row is the narrow cells, then one block-table span per KV pool, then a trash cell:

    [ len(pool 0) .. len(pool P-1) | position offset | GDN slot | pool 0's pages ... | ... | trash ]
      narrow cells (P + 2)                                        span per pool          1

Qwen3.5 text has one KV pool, so its row is 3 narrow cells, one span of
`min(ceil(max_model_len / page_size), num_kv_pages - 1)` pages and the trash cell. The planner
was designed for an engine of many model families and keeps four generalities that Qwen3.5
does not use; they stay, and each is tested (tests/test_planner.py names the tests):

- **Several KV pools per node** (Whisper's decoder holds a self-attention pool and a
  cross-attention context pool): a length cell and a span per pool, each pool's cells written
  and compared on their own (`test_two_pools_*`).
- **Read-only pools** (`PoolLayout.appends` False: a context the decode walk only reads): the
  row keeps its pages and length, but the step writes no token there, the graph does not
  advance its length and its page count never crosses; only a host step can move it, and then
  the row is rewritten whole (`test_a_read_only_pool_*`).
- **Position offsets** (`Positions`: a token at stream index i sits at position offset + i; 0
  for Qwen3.5 text, not for models whose positions start elsewhere): the offset is a cell, and
  the gathered position is offset + stored length of the pool positions follow
  (`position_pool`) (`test_position_offsets_*`).
- **The refusal list**: a resource that cannot keep its part of the row refuses through
  `Resource.resident_refusal()`, and the node stays host-planned with the reason in the log and
  `/debug/config`; the base class refuses, so a new resource is host-planned until it has a
  table (`test_a_resource_without_a_table_keeps_planning_off`).
"""

from __future__ import annotations

from dataclasses import dataclass

SINK_ROW = 0  # the slot padding rows read: sink page, length 0, sink GDN slot
WALKS = ("decode",)  # the steps that plan resident (prefill and mixed steps stay host-planned)


@dataclass(frozen=True)
class PoolLayout:
    """One KV pool's part of a row. A pool the walk only reads (appends False) keeps its pages
    and length on the table but gets no write addressing and no advance."""

    key: str
    length_col: int
    span_start: int
    span: int
    appends: bool


@dataclass(frozen=True)
class ResidentLayout:
    pools: tuple[PoolLayout, ...]
    offset_col: int  # position offset, against `position_pool`
    state_col: int  # GDN slot
    position_pool: str
    trash_col: int
    num_cols: int

    @property
    def num_narrow(self) -> int:
        return len(self.pools) + 2

    def pool(self, key: str) -> PoolLayout:
        return next(p for p in self.pools if p.key == key)

    @property
    def append_cols(self) -> list[int]:
        """The stored-length columns a resident step advances (the appending pools')."""
        return [p.length_col for p in self.pools if p.appends]


def build_layout(pools: list[tuple[str, int, bool]], position_pool: str) -> ResidentLayout:
    """pools: (key, span, appends) in order; narrow cells first, spans after, trash last."""
    if position_pool not in [key for key, _, _ in pools]:
        raise ValueError(f"positions follow pool {position_pool!r}, which the row does not hold")
    num_narrow = len(pools) + 2
    layouts, start = [], num_narrow
    for index, (key, span, appends) in enumerate(pools):
        layouts.append(PoolLayout(key, index, start, span, appends))
        start += span
    return ResidentLayout(tuple(layouts), len(pools), len(pools) + 1, position_pool, start,
                          start + 1)
