"""The trained policy as one module whose forward returns per-token log-probs and entropy
of response tokens, so DDP/FSDP hooks see a single entry point and the [tokens, vocab]
logits are never materialised (:func:`dapo.logprobs.chunked_logprobs`).

Two layouts of a micro-batch: padded (:func:`pack`: every row left-padded to the longest
prompt and right-padded to the longest response) and padding-free (:func:`pack_flat`: the
rows' real tokens concatenated into one row, position ids restarting at 0 per sequence, so
compute and memory follow the real token count). Padding-free micro-batches are cut by
token budget (:func:`token_budget_splitter`, :func:`dapo.microbatch.token_budget_bins`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from dapo.batch import RolloutBatch
from dapo.logprobs import chunked_logprobs
from dapo.microbatch import equalize, row_tokens, token_budget_bins


def pack(
    prompt_ids: Tensor, prompt_len: Tensor, response_ids: Tensor, pad_id: int
) -> tuple[Tensor, Tensor, Tensor, int]:
    """Left-pad each row's prompt to the batch's longest prompt and append the response.

    ``prompt_ids`` [b, P] right-padded with ``prompt_len`` [b]; ``response_ids`` [b, T]
    right-padded. Returns input_ids, attention_mask, position_ids [b, P' + T] and P' (the
    column where every response starts)."""
    p_max = int(prompt_len.max())
    cols = torch.arange(p_max, device=prompt_ids.device).unsqueeze(0)
    shift = (p_max - prompt_len).unsqueeze(1)
    src = (cols - shift).clamp(min=0)
    left = torch.where(cols >= shift, prompt_ids.gather(1, src), torch.full_like(src, pad_id))
    ids = torch.cat([left, response_ids], dim=1)
    attn = torch.cat([(cols >= shift).long(), torch.ones_like(response_ids)], dim=1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    return ids, attn, pos, p_max


def pack_flat(
    prompt_ids: Tensor, prompt_len: Tensor, response_ids: Tensor, response_len: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Concatenate each row's real tokens (``prompt[:prompt_len] + response[:response_len]``)
    into one packed row; rows with ``response_len`` 0 are left out entirely.

    ``prompt_ids`` [b, P] and ``response_ids`` [b, T] right-padded. Returns input_ids and
    position_ids [1, N] (positions restart at 0 at each sequence, which is how transformers
    finds the sequence boundaries: a new sequence wherever the position does not grow by
    exactly 1), ``pred`` [M] (for each real response token in row-major order, the packed
    position whose hidden state predicts it: the token just before it) and the response
    mask [b, T] (M = its sum)."""
    dev = response_ids.device
    b, p_w = prompt_ids.shape
    t = response_ids.shape[1]
    plen = prompt_len.to(dev).long()
    rlen = response_len.to(dev).long()
    has = rlen > 0
    bad = (has & (plen < 1)) | (plen > p_w) | (plen < 0) | (rlen > t) | (rlen < 0)
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise ValueError(
            f"row {row}: prompt_len {int(plen[row])} (of {p_w} columns) and response_len "
            f"{int(rlen[row])} (of {t}); a response needs a prompt of at least one token"
        )
    pmask = (torch.arange(p_w, device=dev).unsqueeze(0) < plen.unsqueeze(1)) & has.unsqueeze(1)
    rmask = torch.arange(t, device=dev).unsqueeze(0) < rlen.unsqueeze(1)
    valid = torch.cat([pmask, rmask], dim=1)
    ids = torch.cat([prompt_ids.to(dev), response_ids], dim=1)[valid].unsqueeze(0)
    pos = (valid.long().cumsum(1) - 1)[valid].unsqueeze(0)
    flat = (valid.reshape(-1).long().cumsum(0) - 1).view(b, p_w + t)
    pred = (flat[:, p_w:] - 1)[rmask]
    return ids, pos, pred, rmask


_PACKED_MASKS: bool | None = None


def _check_packed_masks() -> None:
    """transformers builds a block-diagonal causal mask from packed position ids only since
    ``masking_utils.find_packed_sequence_indices`` (4.56 era); before it, a packed row
    would silently attend across sequences. Refuse rather than train on that."""
    global _PACKED_MASKS
    if _PACKED_MASKS is None:
        try:
            from transformers import masking_utils

            _PACKED_MASKS = hasattr(masking_utils, "find_packed_sequence_indices")
        except ImportError:
            _PACKED_MASKS = False
    if not _PACKED_MASKS:
        raise RuntimeError(
            "the padding-free forward needs transformers >= 4.56 (packed-sequence masks from "
            "position_ids); upgrade transformers or pass response_len=None (padded)"
        )


class Policy(nn.Module):
    """Wraps a transformers causal LM (``.lm``) and computes response log-probs."""

    def __init__(self, lm: nn.Module, chunk: int = 1024):
        super().__init__()
        self.lm = lm
        self.chunk = chunk

    def output_weight(self) -> Tensor:
        return self.lm.get_output_embeddings().weight

    def _decoder(self) -> nn.Module:
        return self.lm.get_decoder() if hasattr(self.lm, "get_decoder") else self.lm.model

    def forward(
        self,
        prompt_ids: Tensor,
        prompt_len: Tensor,
        response_ids: Tensor,
        pad_id: int,
        response_len: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Log-probs and entropy [b, T] of ``response_ids`` after each row's prompt.

        ``response_len`` None: the padded layout (:func:`pack`); every response column gets
        a value (padding columns included, meaningless there). ``response_len`` [b] given:
        padding-free (:func:`pack_flat`, ``attention_mask=None`` so transformers masks by
        sequence from the position ids); log-probs are computed on the real response tokens
        only and padding columns are 0. With no response token at all (b == 0 included) a
        one-token dummy forward runs and the zeros returned are connected to it, so every
        rank of DDP/FSDP runs the same forwards and backwards."""
        dev = self.output_weight().device  # the batch lives on the host until here
        prompt_ids, prompt_len, response_ids = prompt_ids.to(dev), prompt_len.to(dev), response_ids.to(dev)
        if response_len is None:
            return self._padded(prompt_ids, prompt_len, response_ids, pad_id)
        response_len = response_len.to(dev)
        _check_packed_masks()
        ids, pos, pred, rmask = pack_flat(prompt_ids, prompt_len, response_ids, response_len)
        b, t = response_ids.shape
        weight = self.output_weight()
        if pred.numel() == 0:
            dummy = torch.full((1, 1), pad_id, dtype=torch.long, device=response_ids.device)
            hidden = self._decoder()(
                input_ids=dummy, position_ids=torch.zeros_like(dummy), use_cache=False
            ).last_hidden_state
            lp, ent = chunked_logprobs(hidden[0], weight, dummy[0], chunk=self.chunk)
            zero = (lp.sum() + ent.sum()) * 0.0  # every parameter in the graph, gradient 0
            out = torch.zeros(b, t, dtype=lp.dtype, device=response_ids.device) + zero
            return out, out.clone()
        hidden = self._decoder()(
            input_ids=ids, attention_mask=None, position_ids=pos, use_cache=False
        ).last_hidden_state
        lp, ent = chunked_logprobs(hidden[0, pred], weight, response_ids[rmask], chunk=self.chunk)
        zeros = torch.zeros(b, t, dtype=lp.dtype, device=lp.device)
        return zeros.masked_scatter(rmask, lp), zeros.masked_scatter(rmask, ent)

    def _padded(
        self, prompt_ids: Tensor, prompt_len: Tensor, response_ids: Tensor, pad_id: int
    ) -> tuple[Tensor, Tensor]:
        ids, attn, pos, p = pack(prompt_ids, prompt_len, response_ids, pad_id)
        hidden = self._decoder()(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False
        ).last_hidden_state
        t = response_ids.shape[1]
        h = hidden[:, p - 1 : p - 1 + t]  # the state before each response token predicts it
        return chunked_logprobs(h, self.output_weight(), response_ids, chunk=self.chunk)


def response_logp(
    policy: nn.Module, mb: RolloutBatch, pad_id: int, packed: bool = True
) -> tuple[Tensor, Tensor]:
    """Current log-probs and entropy [b, T] of a mini-batch's response tokens.

    ``packed``: padding-free, one row of the micro-batch's real tokens (zeros on padding).
    Otherwise padded to the micro-batch's longest prompt and longest response (values on
    padding columns are meaningless); an empty mini-batch always takes the packed path (its
    dummy forward keeps ranks in step)."""
    x = mb.extras
    if packed or mb.size == 0:
        return policy(x["prompt_ids"], x["prompt_len"], x["response_ids"], pad_id, response_len=mb.lengths)
    t_all = mb.mask.shape[1]
    t = max(1, int(mb.lengths.max()))
    logp, ent = policy(x["prompt_ids"], x["prompt_len"], x["response_ids"][:, :t], pad_id)
    if t < t_all:
        logp = torch.nn.functional.pad(logp, (0, t_all - t))
        ent = torch.nn.functional.pad(ent, (0, t_all - t))
    return logp, ent


def token_budget_splitter(
    batch: RolloutBatch, budget: int, all_reduce_max: Callable[[int], int] | None = None
) -> Callable[[Tensor], list[Tensor]]:
    """``micro_batches`` for :func:`dapo.update`: a window's rows cut into bins of at most
    ``budget`` tokens (:func:`row_tokens`; first-fit decreasing, a longer row alone), then
    padded with empty micro-batches to ``all_reduce_max(number of bins)``, the maximum over
    ranks, so every rank runs as many forwards and backwards (FSDP/DDP collectives)."""
    tokens = row_tokens(batch)

    def split(rows: Tensor) -> list[Tensor]:
        bins = token_budget_bins(tokens[rows.cpu()], budget)
        count = len(bins) if all_reduce_max is None else int(all_reduce_max(len(bins)))
        return [rows[torch.as_tensor(b, dtype=torch.long, device=rows.device)] for b in equalize(bins, count)]

    return split
