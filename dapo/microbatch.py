"""Micro-batches by token budget instead of by row count (verl's "dynamic batch size",
``rearrange_micro_batches``): responses of RL batches range from a few hundred to tens of
thousands of tokens, so a fixed number of rows per forward either wastes memory on short
rows or runs out of it on long ones. With a padding-free (packed) forward the cost of a
micro-batch is its token count, and bins of at most ``budget`` tokens bound the peak
memory whatever the length spread.

Pure functions of row token counts; :func:`dapo.update` takes the resulting split through
its ``micro_batches`` argument. Under data parallelism every rank must run the same number
of forwards/backwards (FSDP/DDP collectives), hence :func:`equalize`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .batch import RolloutBatch


def token_budget_bins(tokens: Sequence[int] | Tensor, budget: int) -> list[list[int]]:
    """First-fit-decreasing bin packing of rows by token count.

    Rows are taken longest first (ties by index, so the result is deterministic); each goes
    into the first open bin it fits in (bin sum + row <= ``budget``), else opens a new bin.
    A row longer than ``budget`` gets a bin of its own (it cannot be split). Returns the
    bins as lists of row indices (``0 .. len(tokens) - 1``, each exactly once), indices in
    ascending order within a bin, bins in the order they were opened. FFD uses at most
    11/9 OPT + 1 bins.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive int, got {budget!r}")
    counts = [int(t) for t in (tokens.tolist() if isinstance(tokens, Tensor) else tokens)]
    if any(c < 0 for c in counts):
        raise ValueError("token counts must be >= 0")
    order = sorted(range(len(counts)), key=lambda i: (-counts[i], i))
    bins: list[list[int]] = []
    sums: list[int] = []
    for i in order:
        c = counts[i]
        for k, s in enumerate(sums):
            if s + c <= budget:
                bins[k].append(i)
                sums[k] += c
                break
        else:
            bins.append([i])
            sums.append(c)
    return [sorted(b) for b in bins]


def equalize(bins: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """``bins`` followed by empty bins up to ``count`` (e.g. the maximum bin count over
    ranks), so every rank runs ``count`` micro-batches. An empty micro-batch still runs a
    forward and a zero backward in :func:`dapo.update`."""
    if count < len(bins):
        raise ValueError(f"count {count} is below the number of bins {len(bins)}")
    return [list(b) for b in bins] + [[] for _ in range(count - len(bins))]


def row_tokens(batch: RolloutBatch) -> Tensor:
    """Tokens each row costs a padding-free forward: prompt + response, 0 for a row with no
    response token (a packed forward leaves it out)."""
    plen = batch.extras["prompt_len"].to(batch.lengths.device).long()
    return torch.where(batch.lengths > 0, plen + batch.lengths.long(), torch.zeros_like(plen)).cpu()


__all__: Sequence[str] = ["equalize", "row_tokens", "token_budget_bins"]
