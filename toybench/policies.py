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

    @torch.no_grad()
    def sample(self, prompts: Tensor, generator: torch.Generator, first: Tensor | None = None) -> Tensor:
        if first is None:
            first = gumbel_sample(self.table[prompts, 0, 0], generator)
        rest = gumbel_sample(self._rows(prompts, first)[:, 1:], generator)
        return torch.cat([first.unsqueeze(1), rest], dim=1)

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=lr)

    def _end_distribution(self) -> tuple[Tensor, Tensor, Tensor]:
        """First-token probs [P, K], P(EOS at position t | path) [P, K, T-1] for t = 1..T-1,
        and P(truncated | path) [P, K]."""
        probs = torch.softmax(self.table, dim=-1)
        first = probs[:, 0, 0, 1:]
        stop = probs[:, 1:, 1:, EOS].permute(0, 2, 1)
        survive = torch.cumprod(1 - stop, dim=-1)
        reach = torch.cat([torch.ones_like(survive[..., :1]), survive[..., :-1]], dim=-1)
        return first, reach * stop, survive[..., -1]

    @torch.no_grad()
    def exact_lengths(self) -> Tensor:
        """[P, K] expected response length (tokens, EOS included) after choosing path k."""
        _, end_at, trunc = self._end_distribution()
        positions = torch.arange(1, end_at.shape[-1] + 1, dtype=end_at.dtype)
        return (end_at * (positions + 1)).sum(-1) + trunc * self.task.max_len

    @torch.no_grad()
    def exact_accuracy(self) -> Tensor:
        """[P] exact probability that a response to each prompt is correct.

        Under path k the stop probability at position t >= 1 is s_t; EOS at position t
        means t - 1 work tokens, and terminating at t has probability
        prod_{j<t} (1 - s_j) * s_t. Success needs work >= need_work and the quality draw."""
        task = self.task
        first, end_at, _ = self._end_distribution()
        work = torch.arange(end_at.shape[-1])  # work tokens when EOS is at position t
        enough = work.view(1, 1, -1) >= task.need_work.unsqueeze(-1)
        finish = (end_at * enough).sum(-1)  # [P, K]
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
