"""Memory-bounded per-token log-probs and entropy from hidden states and the output layer.

For a 152k vocabulary the [tokens, vocab] fp32 logits of one 20k-token response take
12 GB. :func:`chunked_logprobs` never holds more than ``chunk`` rows of them: the forward
computes log-prob and entropy chunk by chunk and keeps only per-token scalars; the
backward recomputes each chunk's logits and turns the incoming gradients into gradients of
the hidden states and the weight.

With z = h W^T / T (T the sampling temperature), p = softmax(z):

* log p(y) = z_y - logsumexp(z), d/dz = onehot(y) - p
* H = logsumexp(z) - sum_j p_j z_j, dH/dz_j = -p_j (z_j - E_p[z])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _chunk_stats(
    h: Tensor, weight: Tensor, targets: Tensor, inv_temp: float
) -> tuple[Tensor, Tensor, Tensor]:
    z = (h.float() @ weight.float().t()) * inv_temp
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    p = torch.softmax(z, dim=-1)
    entropy = lse - (p * z).sum(-1)
    return logp, entropy, z


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int, inv_temp: float
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk):
            lp, ent, _ = _chunk_stats(hidden[s : s + chunk], weight, targets[s : s + chunk], inv_temp)
            logp[s : s + chunk] = lp
            entropy[s : s + chunk] = ent
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk, ctx.inv_temp = chunk, inv_temp
        return logp, entropy

    @staticmethod
    def backward(
        ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        hidden, weight, targets = ctx.saved_tensors
        chunk, inv_temp = ctx.chunk, ctx.inv_temp
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            z = (h.float() @ weight.float().t()) * inv_temp
            p = torch.softmax(z, dim=-1)
            dz = torch.zeros_like(z)
            if g_logp is not None:
                gl = g_logp[s : s + chunk].float().unsqueeze(-1)
                dz -= gl * p
                dz.scatter_add_(-1, targets[s : s + chunk].unsqueeze(-1), gl)
            if g_ent is not None:
                ge = g_ent[s : s + chunk].float().unsqueeze(-1)
                mean_z = (p * z).sum(-1, keepdim=True)
                dz -= ge * p * (z - mean_z)
            dz *= inv_temp
            if grad_h is not None:
                grad_h[s : s + chunk] = (dz @ weight.float()).to(hidden.dtype)
            if grad_w is not None:
                grad_w += dz.t() @ h.float()
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None, None


def chunked_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, chunk: int = 1024, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Log-prob of ``targets`` and entropy of the full next-token distribution, per token.

    ``hidden`` is [..., H] (any leading shape), ``weight`` the output layer [V, H],
    ``targets`` [...] token ids. Returns two fp32 tensors shaped like ``targets``. Peak
    extra memory is O(chunk x V) instead of O(tokens x V); values and gradients equal the
    naive ``log_softmax(hidden @ weight.T / temperature)`` path up to fp32 rounding.
    """
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    shape = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    # torch's Function.apply is unannotated; forward above fixes what it returns.
    out: tuple[Tensor, Tensor] = _ChunkedLogProbs.apply(  # type: ignore[no-untyped-call]
        h, weight, targets.reshape(-1), chunk, 1.0 / temperature
    )
    logp, entropy = out
    return logp.view(shape), entropy.view(shape)


def naive_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """The reference path: full fp32 logits. For tests and benchmarks only."""
    z = (hidden.float() @ weight.float().t()) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
