"""Tiny policies for the token MDPs. Both give, per response token, the log-prob of the
sampled token and the entropy of the *full* next-token distribution, so entropy is exact.

* :class:`TabularPolicy`: a softmax table over (prompt, position, path), trained with plain
  SGD on the logits (clean dynamics: the gradient step is the textbook softmax PG step).
* :class:`GRUPolicy`: a GRU over the prefix with a prompt embedding, trained with Adam
  (closer to a real network: shared parameters, adaptive steps, realistic instability).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from .tasks import EOS, TokenTask


def gumbel_sample(logits: Tensor, generator: torch.Generator) -> Tensor:
    """Exact categorical sampling by the Gumbel-max trick, reproducible under ``generator``."""
    u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype).clamp_(1e-12, 1.0 - 1e-12)
    return torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)


class ToyPolicy(nn.Module, ABC):
    """Common interface: ``logits(prompts, tokens)`` teacher-forced over a whole response and
    ``sample(prompts, generator)`` for rollouts."""

    task: TokenTask

    @abstractmethod
    def logits(self, prompts: Tensor, tokens: Tensor) -> Tensor:
        """[B, T, V] next-token logits at each position given the prefix before it."""

    @abstractmethod
    def sample(self, prompts: Tensor, generator: torch.Generator, first: Tensor | None = None) -> Tensor:
        """[B, max_len] sampled tokens (anything after the first EOS is ignored); ``first``
        forces the first token (the path) instead of sampling it."""

    @abstractmethod
    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        """The optimizer this policy class is trained with."""

    def first_token_probs(self, prompts: Tensor) -> Tensor:
        """[B, V] distribution of the first token (the path choice)."""
        dummy = torch.zeros(prompts.shape[0], 1, dtype=torch.long)
        return torch.softmax(self.logits(prompts, dummy)[:, 0], dim=-1)

    def logp_entropy(self, prompts: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Per-token log-prob of ``tokens`` and entropy of the full distribution, [B, T]."""
        logp_all = torch.log_softmax(self.logits(prompts, tokens), dim=-1)
        logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy


class TabularPolicy(ToyPolicy):
    """Logits ``W[prompt, position, path, token]``; path is 0 before the first token.

    Initialised from the task's prior (the base model) plus N(0, ``init_noise``) per seed.
    """

    def __init__(self, task: TokenTask, generator: torch.Generator, init_noise: float = 0.5):
        super().__init__()
        self.task = task
        p, t, k, v = task.num_prompts, task.max_len, task.num_paths, task.vocab_size
        w = torch.zeros(p, t, k + 1, v, dtype=torch.float64)
        w[:, 0, 0, 1:] = task.prior_path
        w[:, 0, 0, EOS] = task.prior_empty
        w[:, 1:, :, EOS] = task.prior_stop
        w += init_noise * torch.randn(w.shape, generator=generator, dtype=torch.float64)
        self.table = nn.Parameter(w)

    def _rows(self, prompts: Tensor, path: Tensor) -> Tensor:
        t = self.task.max_len
        state = path.unsqueeze(1).expand(-1, t).clone()
        state[:, 0] = 0
        return self.table[prompts.unsqueeze(1), torch.arange(t).unsqueeze(0), state]  # [B, T, V]

    def logits(self, prompts: Tensor, tokens: Tensor) -> Tensor:
        t = tokens.shape[1]
        return self._rows(prompts, tokens[:, 0])[:, :t]

    def logp_entropy(self, prompts: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Per-token log-prob and entropy [B, T], from the log-softmax of the whole table
        (one row per state, so each state's normaliser is computed once however many
        responses visit it; :mod:`toybench.engine` does the same arithmetic per run)."""
        return table_logp_entropy(self.table, prompts, tokens)

    @torch.no_grad()
    def sample(self, prompts: Tensor, generator: torch.Generator, first: Tensor | None = None) -> Tensor:
        """Inverse-CDF sampling, one uniform per position: ``b`` for the first token (unless
        ``first`` is forced), then ``b x (T - 1)`` for the rest (:func:`sample_table`)."""
        b, t = prompts.shape[0], self.task.max_len
        u_first = None if first is not None else torch.rand(b, generator=generator, dtype=torch.float64)
        u_rest = torch.rand((b, t - 1), generator=generator, dtype=torch.float64)
        return sample_table(table_cdf(self.table.detach()), prompts, u_first, u_rest, first=first)

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=lr)

    def _end_distribution(self) -> tuple[Tensor, Tensor, Tensor]:
        return end_distribution(self.table)

    @torch.no_grad()
    def exact_lengths(self) -> Tensor:
        """[P, K] expected response length (tokens, EOS included) after choosing path k."""
        return exact_lengths(self.table, self.task)

    @torch.no_grad()
    def exact_accuracy(self) -> Tensor:
        """[P] exact probability that a response to each prompt is correct."""
        return exact_accuracy(self.table, self.task)


def table_logp_entropy(
    table: Tensor, prompts: Tensor, tokens: Tensor, run: Tensor | None = None, entropy: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each token and entropy of its state's distribution, [..., T], for
    responses ``tokens`` [..., T] to ``prompts`` [...] under ``table``; with ``run``
    ([...]) the table has a leading run dimension and row i reads ``table[run[i]]``.
    The entropy is detached (None with ``entropy=False``).

    The log-softmax is taken once over the whole table, token-major (a fast kernel for a
    small vocabulary), and read with one flat index, so a run's gradient accumulates in
    the same order whether or not other runs share the table."""
    return read_log_table(table_log_softmax(table), table.shape, prompts, tokens, run, entropy)


def table_log_softmax(table: Tensor) -> Tensor:
    """The log-softmax of every state, token-major [V, (R,) P, T, K + 1] (differentiable)."""
    return torch.log_softmax(table.movedim(-1, 0), dim=0)


def read_log_table(
    logp_table: Tensor,
    shape: torch.Size,
    prompts: Tensor,
    tokens: Tensor,
    run: Tensor | None = None,
    entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """:func:`table_logp_entropy` from a :func:`table_log_softmax` already taken (of a table of
    ``shape``), so that two reads of one table compute its normalisers once."""
    p, t_max, k1 = shape[-4:-1]
    t = tokens.shape[-1]
    pos = torch.arange(t)
    state = (prompts.unsqueeze(-1) * t_max + pos) * k1 + tokens[..., :1] * (pos > 0)  # path 0 at position 0
    if run is not None:
        state = state + run.unsqueeze(-1) * (p * t_max * k1)
    n_states = logp_table[0].numel()
    logp = logp_table.reshape(-1)[tokens * n_states + state]
    if not entropy:
        return logp, None
    with torch.no_grad():
        ent = -(logp_table.exp() * logp_table).sum(0).reshape(-1)[state]
    return logp, ent


def table_probs(table: Tensor) -> Tensor:
    """Next-token distribution of every state, token-major [V, ..., P, T, K + 1] (the layout
    :func:`table_cdf` and :func:`end_distribution` compute from; pass it to both to compute
    it once)."""
    return torch.softmax(table.movedim(-1, 0), dim=0)


def table_cdf(table: Tensor, probs: Tensor | None = None) -> Tensor:
    """Cumulative next-token distribution of every state, token-minor [..., P, T, K + 1, V]."""
    probs = table_probs(table) if probs is None else probs
    return probs.cumsum(0).movedim(0, -1).contiguous()


def sample_table(
    cdf: Tensor,
    prompts: Tensor,
    u_first: Tensor | None,
    u_rest: Tensor,
    first: Tensor | None = None,
    run: Tensor | None = None,
) -> Tensor:
    """[b, T] tokens by inverse CDF: token = #{k : u > cdf_k}, exact up to the float64
    rounding of the CDF. ``prompts`` [b]; ``u_first`` [b] (or ``first`` forced), ``u_rest``
    [b, T - 1]; with ``run`` [b], ``cdf`` has a leading run dimension."""
    p, t, k1, v = cdf.shape[-4:]
    rows = cdf.reshape(-1, v)
    state0 = prompts * (t * k1) if run is None else (run * p + prompts) * (t * k1)  # position 0, path 0
    if first is None:
        first = (u_first.unsqueeze(-1) > rows.index_select(0, state0)).sum(-1).clamp(max=v - 1)
    later = state0.unsqueeze(1) + torch.arange(1, t) * k1 + first.unsqueeze(1)  # positions 1.., that path
    cdf_rest = rows.index_select(0, later.view(-1)).view(*later.shape, v)
    rest = (u_rest.unsqueeze(-1) > cdf_rest).sum(-1).clamp(max=v - 1)
    return torch.cat([first.unsqueeze(1), rest], dim=1)


# Closed forms of a softmax table W[..., prompt, position, path, token]; leading dimensions
# index independent runs (the batched engine holds one table per seed).


def end_distribution(table: Tensor, probs: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """First-token probs [..., P, K], P(EOS at position t | path) [..., P, K, T-1] for
    t = 1..T-1, and P(truncated | path) [..., P, K]; ``probs``: :func:`table_probs` of it."""
    probs = table_probs(table) if probs is None else probs  # [V, ..., P, T, K + 1]
    first = probs[1:, ..., 0, 0].movedim(0, -1)
    stop = probs[EOS, ..., 1:, 1:].transpose(-1, -2)
    survive = torch.cumprod(1 - stop, dim=-1)
    reach = torch.cat([torch.ones_like(survive[..., :1]), survive[..., :-1]], dim=-1)
    return first, reach * stop, survive[..., -1]


@torch.no_grad()
def exact_lengths(table: Tensor, task: TokenTask, probs: Tensor | None = None) -> Tensor:
    """[..., P, K] expected response length (tokens, EOS included) after choosing path k."""
    _, end_at, trunc = end_distribution(table, probs)
    positions = torch.arange(1, end_at.shape[-1] + 1, dtype=end_at.dtype)
    return (end_at * (positions + 1)).sum(-1) + trunc * task.max_len


@torch.no_grad()
def exact_accuracy(table: Tensor, task: TokenTask, probs: Tensor | None = None) -> Tensor:
    """[..., P] exact probability that a response to each prompt is correct.

    Under path k the stop probability at position t >= 1 is s_t; EOS at position t
    means t - 1 work tokens, and terminating at t has probability
    prod_{j<t} (1 - s_j) * s_t. Success needs work >= need_work and the quality draw."""
    first, end_at, _ = end_distribution(table, probs)
    work = torch.arange(end_at.shape[-1])  # work tokens when EOS is at position t
    enough = work.view(1, 1, -1) >= task.need_work.unsqueeze(-1)
    finish = (end_at * enough).sum(-1)  # [..., P, K]
    return (first * task.quality * finish).sum(-1)


class GRUPolicy(ToyPolicy):
    """Embedding(prompt) + GRU over the prefix -> linear head. The head's bias starts at
    the task's stop prior so both policies begin with a comparable appetite for length."""

    def __init__(self, task: TokenTask, generator: torch.Generator, hidden: int = 32):
        super().__init__()
        self.task = task
        v = task.vocab_size
        self.bos = v
        self.prompt_emb = nn.Embedding(task.num_prompts, hidden)
        self.tok_emb = nn.Embedding(v + 1, hidden)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, v)
        with torch.no_grad():
            for prm in self.parameters():
                prm.copy_(torch.randn(prm.shape, generator=generator) * 0.3)
            self.head.bias.zero_()
            self.head.bias[EOS] = task.prior_stop
        self.double()

    def _inputs(self, prompts: Tensor, prev: Tensor) -> Tensor:
        return self.tok_emb(prev) + self.prompt_emb(prompts).unsqueeze(1)

    def logits(self, prompts: Tensor, tokens: Tensor) -> Tensor:
        prev = torch.cat([torch.full_like(tokens[:, :1], self.bos), tokens[:, :-1]], dim=1)
        out, _ = self.gru(self._inputs(prompts, prev))
        return self.head(out)

    @torch.no_grad()
    def sample(self, prompts: Tensor, generator: torch.Generator, first: Tensor | None = None) -> Tensor:
        b = prompts.shape[0]
        prev = torch.full((b, 1), self.bos, dtype=torch.long)
        h = None
        out = []
        for t in range(self.task.max_len):
            o, h = self.gru(self._inputs(prompts, prev), h)
            tok = gumbel_sample(self.head(o[:, -1]), generator)
            if t == 0 and first is not None:
                tok = first
            out.append(tok)
            prev = tok.unsqueeze(1)
        return torch.stack(out, dim=1)

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=lr)


POLICIES = {"tabular": TabularPolicy, "gru": GRUPolicy}
