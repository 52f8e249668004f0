"""StepMeta: everything a forward needs to know about one step, as tensors.

A step is B rows (sequences), each bringing its own number of new tokens, T tokens in all, laid out
row after row. Prefill chunks and single-token decode rows share one layout, so one forward serves
prefill, decode and mixed steps, and a decode step's tensors can live at fixed addresses for a
captured graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GDN_CHUNK = 64  # tokens a chunk of the chunked delta rule (fla's BT)


@dataclass(frozen=True)
class GdnSplit:
    """A padded step's rows as its GDN layers take them. D_cap decode rows and P_cap prefill
    rows are the bucket's capacities; padding entries point at the sink slot."""

    decode_slots: torch.Tensor  # [D_cap] int64: decode row r is token r; sink past the real ones
    # the prefill rows as chunked sequences: sequence 0 is the decode tokens [0, D) on the sink
    # (whatever it computes is overwritten by the decode rows' own step), then one sequence a
    # prefill row, then zero-length sequences
    cu_seqlens: torch.Tensor  # [P_cap + 2] int64, from 0
    slots: torch.Tensor  # [P_cap + 1] int64: each sequence's state slot
    chunks: torch.Tensor  # [NT, 2] int64: (sequence, chunk) of every 64-token chunk, padded
    chunk_offsets: torch.Tensor  # [P_cap + 2] int64: each sequence's first chunk, then NT real
    chunk_size: int  # tokens a chunk (fla's BT)


@dataclass(frozen=True)
class StepMeta:
    positions: torch.Tensor  # [T] int64: each token's position in its sequence
    token_seq: torch.Tensor  # [T] int64: the row each token belongs to
    query_start_loc: torch.Tensor  # [B+1] int64: row b's tokens are [qsl[b], qsl[b+1])
    block_tables: torch.Tensor  # [B, W] int32: row b's KV pages in order (W bounds the reads)
    kv_write_loc: torch.Tensor  # [T] int64: page * page_size + offset for each token's K/V
    state_slots: torch.Tensor  # [B] int64: row b's GDN state slot
    logits_indices: torch.Tensor  # [S] int64: tokens whose logits are sampled, in row order
    max_query_len: int  # static: most new tokens in one row (1 for decode)
    # A padded varlen step (engine/inputs.py) splits its GDN layers: its leading decode rows
    # (tokens 0..D-1) step in place by slot, its prefill rows run chunked as sequences.
    gdn_split: GdnSplit | None = None

    @property
    def num_rows(self) -> int:
        return self.state_slots.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]


def chunk_counts(cu_seqlens: np.ndarray, chunk: int) -> np.ndarray:
    """The chunks of each sequence cu_seqlens bounds (a zero-length one has none)."""
    return -(-np.diff(cu_seqlens) // chunk)


def chunk_table(cu_seqlens: np.ndarray, table: np.ndarray, offsets: np.ndarray,
                chunk: int) -> int:
    """(sequence, chunk) of every chunk of the sequences cu_seqlens bounds, in order (fla's
    prepare_chunk_indices), into table [NT, 2], the rest of it (0, NT): a chunk past any
    sequence's end, which every kernel masks out; and each sequence's first chunk in the table
    then the real chunks' count, into offsets [len(cu_seqlens)] (fla's prepare_chunk_offsets).
    Zero-length sequences add no chunk. Returns the real chunks."""
    counts = chunk_counts(cu_seqlens, chunk)
    total = int(counts.sum())
    if total > len(table):
        raise ValueError(f"{total} chunks exceed the table's {len(table)}")
    offsets[0] = 0
    np.cumsum(counts, out=offsets[1:len(cu_seqlens)])
    table[:total, 0] = np.repeat(np.arange(len(counts)), counts)
    table[:total, 1] = np.arange(total) - np.repeat(offsets[:len(counts)], counts)
    table[total:] = (0, len(table))
    return total


def build_step_meta(
    rows: list[tuple[int, int, list[int], int]],
    page_size: int,
    device: torch.device | str = "cpu",
) -> StepMeta:
    """Builds a StepMeta from host rows: (start position, new tokens, pages, state slot).

    Convenience for tests and direct model use; the engine fills fixed buffers instead.
    """
    positions, token_seq, write_loc, qsl = [], [], [], [0]
    width = max(len(pages) for _, _, pages, _ in rows)
    for row, (start, num_new, pages, _) in enumerate(rows):
        for pos in range(start, start + num_new):
            positions.append(pos)
            token_seq.append(row)
            write_loc.append(pages[pos // page_size] * page_size + pos % page_size)
        qsl.append(qsl[-1] + num_new)
    tables = [pages + [0] * (width - len(pages)) for _, _, pages, _ in rows]

    def long(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return StepMeta(
        positions=long(positions),
        token_seq=long(token_seq),
        query_start_loc=long(qsl),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        kv_write_loc=long(write_loc),
        state_slots=long([slot for *_, slot in rows]),
        logits_indices=long(qsl[1:]) - 1,
        max_query_len=max(num_new for _, num_new, _, _ in rows),
    )
