"""PagedLayout: a step's rows as FlashInfer's host-side page lists (indptr, indices, last_page_len).

Only backends that plan on the host need it; building it is part of the host plan's cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resident.resources.kv import SINK_PAGE


@dataclass(frozen=True)
class PagedLayout:
    qo_indptr: torch.Tensor  # [B+1] int32 (cpu): row b's query tokens
    kv_indptr: torch.Tensor  # [B+1] int32 (cpu): row b's pages are indices[indptr[b]:indptr[b+1]]
    kv_indices: torch.Tensor  # [sum pages] int32 (cpu)
    kv_last_page_len: torch.Tensor  # [B] int32 (cpu): tokens in each row's last page


def table_layout(tables: np.ndarray, kv_lens: np.ndarray, q_lens: np.ndarray,
                 page_size: int) -> PagedLayout:
    """From a step's host block tables ([B, W], row b's pages in order: the runner stages them
    anyway) and each row's KV length after the step and new tokens ([B]). Vectorised: the
    host plan's cost at high concurrency."""
    num_rows = len(kv_lens)
    num_pages = -(-kv_lens // page_size)
    live = np.arange(tables.shape[1])[None, :] < num_pages[:, None]
    kv_indptr = np.zeros(num_rows + 1, np.int32)
    np.cumsum(num_pages, out=kv_indptr[1:])
    qo_indptr = np.zeros(num_rows + 1, np.int32)
    np.cumsum(q_lens, out=qo_indptr[1:])
    last = (kv_lens - (num_pages - 1) * page_size).astype(np.int32)
    return PagedLayout(torch.from_numpy(qo_indptr), torch.from_numpy(kv_indptr),
                       torch.from_numpy(tables[live].astype(np.int32)), torch.from_numpy(last))


def paged_layout(rows: list[tuple[list[int], int, int]], page_size: int,
                 pad_to: int = 0) -> PagedLayout:
    """rows: (pages, kv_len after the step, new tokens). Rows past len(rows) up to `pad_to` are
    padding: one token on the sink page. For tests and benches; the runner has tables."""
    num_rows = max(len(rows), pad_to)
    width = max([len(pages) for pages, _, _ in rows] + [1])
    tables = np.full((num_rows, width), SINK_PAGE, np.int32)
    kv_lens, q_lens = np.ones(num_rows, np.int64), np.ones(num_rows, np.int64)
    for index, (pages, kv_len, num_new) in enumerate(rows):
        tables[index, :len(pages)] = pages
        kv_lens[index], q_lens[index] = kv_len, num_new
    return table_layout(tables, kv_lens, q_lens, page_size)


class PlanReuse:
    """Each bucket's last planned page lists. FlashInfer's fa2 decode plan schedules from the
    page counts (kv_indptr), the batch size and the heads only; the last-page lengths are copied
    into a buffer that `run` reads. So a layout whose kv_indptr and kv_indices equal the last
    plan's (no row changed, none crossed a page) needs only its last-page lengths written."""

    def __init__(self) -> None:
        self._planned: dict[int, PagedLayout] = {}

    def reusable(self, bucket: int, layout: PagedLayout) -> bool:
        last = self._planned.get(bucket)
        return (last is not None and torch.equal(last.kv_indptr, layout.kv_indptr)
                and torch.equal(last.kv_indices, layout.kv_indices))

    def planned(self, bucket: int, layout: PagedLayout) -> None:
        self._planned[bucket] = layout
