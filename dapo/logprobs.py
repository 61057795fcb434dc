"""Memory-bounded per-token log-probs and entropy from hidden states and the output layer.

For a 152k vocabulary the [tokens, vocab] fp32 logits of one 20k-token response take
12 GB. :func:`chunked_logprobs` never holds more than ``chunk`` rows of them: the forward
computes log-prob and entropy chunk by chunk and keeps only per-token scalars; the
backward recomputes each chunk's logits and turns the incoming gradients into gradients of
the hidden states and the weight.

With z = h W^T / T (T the sampling temperature), p = softmax(z):

* log p(y) = z_y - logsumexp(z), d/dz = onehot(y) - p
* H = logsumexp(z) - sum_j p_j z_j = -sum_j p_j log p_j, dH/dz_j = -p_j (z_j - E_p[z]),
  where z_j - E_p[z] = log p_j + H

Precision. The weight is never copied to another dtype (a bf16 lm_head of Qwen2.5-32B,
152,064 x 5,120, would be a 3.1 GB fp32 copy). Each chunk's matmul runs in the weight's
dtype (the chunk of ``h`` is cast to it) and only the [chunk, V] logits are upcast to the
accumulation dtype: fp32, or fp64 for an fp64 weight. With a bf16 weight the logits are
therefore rounded to bf16 before the upcast, as when a bf16 model's ``lm_head`` output is
upcast for the log-softmax (Liger-Kernel's fused linear cross-entropy also starts from the
bf16 logits of each chunk). Softmax, log-prob, entropy and the
logits' gradient dz are fp32. In the backward dz is cast to the weight's dtype for the two
matmuls, grad_h = dz W and grad_W += dz^T h; grad_W is accumulated in the weight's dtype
across chunks with ``addmm_`` (Liger-Kernel's default too), so a bf16 grad_W is rounded to
bf16 once per chunk (ceil(tokens / chunk) roundings, instead of the one rounding of a
single full matmul). An fp32 grad_W accumulator would be a full [V, H] fp32 tensor, the
copy this module exists to avoid. For fp32 (and fp64) weights every cast is a no-op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def _acc_dtype(weight: Tensor) -> torch.dtype:
    """fp32 for bf16/fp16/fp32 weights, fp64 for fp64 ones."""
    return torch.promote_types(weight.dtype, torch.float32)


def _chunk_logits(h: Tensor, weight: Tensor, inv_temp: float) -> Tensor:
    """z = h W^T / T for one chunk: the matmul in the weight's dtype, the [chunk, V] result
    upcast to the accumulation dtype (a fresh tensor, safe to modify in place)."""
    z = (h.to(weight.dtype) @ weight.t()).to(_acc_dtype(weight))
    if inv_temp != 1.0:
        z.mul_(inv_temp)
    return z


def _chunk_stats(
    h: Tensor, weight: Tensor, targets: Tensor, inv_temp: float
) -> tuple[Tensor, Tensor, Tensor]:
    """log p(y), H and logsumexp(z) of one chunk; at most two [chunk, V] buffers live."""
    z = _chunk_logits(h, weight, inv_temp)
    lse = torch.logsumexp(z, dim=-1)
    log_p = z.sub_(lse.unsqueeze(-1))  # in place: z is not needed any more
    logp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -log_p.exp().mul_(log_p).sum(-1)
    return logp, entropy, lse


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int, inv_temp: float
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        acc = _acc_dtype(weight)
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device)
        # per-token logsumexp(z) and H in the accumulation dtype, for the backward
        lse_all = torch.empty(n, dtype=acc, device=hidden.device)
        ent_all = torch.empty(n, dtype=acc, device=hidden.device)
        for s in range(0, n, chunk):
            lp, ent, lse = _chunk_stats(hidden[s : s + chunk], weight, targets[s : s + chunk], inv_temp)
            logp[s : s + chunk] = lp
            entropy[s : s + chunk] = ent
            lse_all[s : s + chunk] = lse
            ent_all[s : s + chunk] = ent
        ctx.save_for_backward(hidden, weight, targets, lse_all, ent_all)
        ctx.chunk, ctx.inv_temp = chunk, inv_temp
        # an output nobody differentiates arrives as None: its term is skipped
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(
        ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        hidden, weight, targets, lse_all, ent_all = ctx.saved_tensors
        chunk, inv_temp = ctx.chunk, ctx.inv_temp
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (g_logp is None and g_ent is None) or not (need_h or need_w):
            return None, None, None, None, None
        acc = _acc_dtype(weight)
        gl_all = g_logp.to(acc) if g_logp is not None else None
        ge_all = g_ent.to(acc) if g_ent is not None else None
        grad_h = torch.empty_like(hidden) if need_h else None
        # weight dtype, never a full-size fp32 buffer (see the module docstring)
        grad_w = torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device) if need_w else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            # dz = gl onehot(y) - p (gl + ge (log p + H)), then the 1/T of z = h W^T / T
            log_p = _chunk_logits(h, weight, inv_temp).sub_(lse_all[s : s + chunk].unsqueeze(-1))
            p = log_p.exp()
            if ge_all is not None:
                ge = ge_all[s : s + chunk].unsqueeze(-1)
                dz = log_p.add_(ent_all[s : s + chunk].unsqueeze(-1)).mul_(ge)
                if gl_all is not None:
                    dz.add_(gl_all[s : s + chunk].unsqueeze(-1))
                dz.mul_(p).neg_()
            else:
                assert gl_all is not None
                dz = p.mul_(-gl_all[s : s + chunk].unsqueeze(-1))
            del log_p, p
            if gl_all is not None:
                dz.scatter_add_(-1, targets[s : s + chunk].unsqueeze(-1), gl_all[s : s + chunk].unsqueeze(-1))
            if inv_temp != 1.0:
                dz.mul_(inv_temp)
            dz_w = dz.to(weight.dtype)
            del dz
            if grad_h is not None:
                grad_h[s : s + chunk] = dz_w @ weight
            if grad_w is not None:
                grad_w.addmm_(dz_w.t(), h.to(weight.dtype))
        return grad_h, grad_w, None, None, None


def chunked_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, chunk: int = 1024, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Log-prob of ``targets`` and entropy of the full next-token distribution, per token.

    ``hidden`` is [..., H] (any leading shape), ``weight`` the output layer [V, H],
    ``targets`` [...] token ids. Returns two fp32 tensors shaped like ``targets``; the
    gradients have the dtypes of ``hidden`` and ``weight``. Peak extra memory is
    O(chunk x V) plus the weight's gradient, never a copy of the weight in another dtype.
    Values and gradients equal the naive ``log_softmax(hidden @ weight.T / temperature)``
    path (:func:`naive_logprobs`) up to fp32 rounding for fp32 weights; for a bf16 weight
    the logits are bf16 matmul outputs and grad_W is accumulated in bf16 chunk by chunk
    (module docstring).
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
    """The reference path: the full [tokens, V] logits through ``log_softmax`` with autograd.
    For tests and benchmarks only.

    Same dtype policy as :func:`chunked_logprobs` (matmul in the weight's dtype, logits
    upcast to fp32, fp64 for an fp64 weight), so pass fp32 copies for an fp32 reference."""
    z = (hidden.to(weight.dtype) @ weight.t()).to(_acc_dtype(weight)) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
