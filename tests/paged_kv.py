"""Paged KV caches for the attention kernels' tests: contiguous rows scattered into pages in
a shuffled order (the layout kernels/decode_attention.py reads), and the contiguous rows
as the kernels read them (one page of L positions a row: the slot-indexed layout)."""

from __future__ import annotations

import torch
from torch import Tensor


def garbage(x: Tensor) -> float:
    """What no position a kernel reads may hold: NaN (packed FP8: NaN codes and scales)."""
    return 255 if x.dtype == torch.uint8 else float("nan")


def to_pages(
    rows: Tensor, page: int, *, shared: list[tuple[int, int, int]] = (), spare_columns: int = 2,
    spare_pages: int = 3, seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """rows [R, L, K, D'] (any dtype, packed FP8 included) -> (cache [num_pages, page, K, D'],
    page table int32 [R, ceil(L / page) + spare_columns]).

    Row r's page j holds rows[r, j*page : (j+1)*page] (the last one padded with garbage);
    pages come in a shuffled order after page 0 (the engine's scratch page); the spare
    pages and the table's spare columns, which point at them, hold garbage. `shared`:
    (leader, follower, n) points the follower's first n pages at the leader's (the rows
    must hold the same values there); the follower's own copies become garbage."""
    r, length = rows.shape[:2]
    per_row = -(-length // page)
    g = torch.Generator().manual_seed(seed)
    used = r * per_row
    order = (1 + torch.randperm(used + spare_pages, generator=g)).to(rows.device)
    table = order[:used].view(r, per_row)
    spare = order[used:]
    extra = spare[torch.randint(len(spare), (r, spare_columns), generator=g).to(rows.device)]
    cache = torch.full((1 + used + spare_pages, page, *rows.shape[2:]), garbage(rows), dtype=rows.dtype,
                       device=rows.device)
    padded = torch.full((r, per_row * page, *rows.shape[2:]), garbage(rows), dtype=rows.dtype, device=rows.device)
    padded[:, :length] = rows
    cache[table.flatten()] = padded.flatten(0, 1).unflatten(0, (used, page))
    for leader, follower, n in shared:
        assert torch.equal(rows[leader, : n * page], rows[follower, : n * page]), "shared pages must hold equal rows"
        cache[table[follower, :n]] = garbage(cache)
        table[follower, :n] = table[leader, :n]
    return cache, torch.cat([table, extra], 1).int().contiguous()


def row_table(cache: Tensor) -> Tensor:
    """The page table that reads contiguous rows [R, L, ..] (L a power of two) as one page a
    row."""
    return torch.arange(cache.shape[0], dtype=torch.int32, device=cache.device)[:, None]


def spoil_past(cache: Tensor, table: Tensor, rows: Tensor, ends: Tensor) -> None:
    """Garbage at every position >= ends[i] of each page-table row rows[i], through the
    table (the pages of other rows untouched unless shared)."""
    page = cache.shape[1]
    for row, end in zip(rows.tolist(), ends.tolist()):
        for j in range(end // page, table.shape[1]):
            cache[int(table[row, j]), max(0, end - j * page):] = garbage(cache)
