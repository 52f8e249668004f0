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

    @property
    def num_rows(self) -> int:
        return self.kv_last_page_len.shape[0]


def paged_layout(rows: list[tuple[list[int], int, int]], page_size: int,
                 pad_to: int = 0) -> PagedLayout:
    """rows: (pages, kv_len after the step, new tokens). Rows past len(rows) up to `pad_to` are
    padding: one token on the sink page."""
    pad = max(0, pad_to - len(rows))
    kv_lens = np.fromiter((kv_len for _, kv_len, _ in rows), np.int32, len(rows))
    new = np.fromiter((num_new for *_, num_new in rows), np.int32, len(rows))
    num_pages = -(-kv_lens // page_size)
    pages = [np.asarray(p[:n], dtype=np.int32) for (p, _, _), n in zip(rows, num_pages,
                                                                       strict=True)]
    indices = np.concatenate(pages + [np.full(pad, SINK_PAGE, np.int32)])
    kv_indptr = np.zeros(len(rows) + pad + 1, np.int32)
    np.cumsum(np.concatenate([num_pages, np.ones(pad, np.int32)]), out=kv_indptr[1:])
    qo_indptr = np.zeros(len(rows) + pad + 1, np.int32)
    np.cumsum(np.concatenate([new, np.ones(pad, np.int32)]), out=qo_indptr[1:])
    last = np.concatenate([kv_lens - (num_pages - 1) * page_size, np.ones(pad, np.int32)])
    return PagedLayout(torch.from_numpy(qo_indptr), torch.from_numpy(kv_indptr),
                       torch.from_numpy(indices), torch.from_numpy(last.astype(np.int32)))
