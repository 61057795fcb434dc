"""The rollout engine interface: prompts (token ids), n samples each, sampling parameters ->
response token ids, the engine's per-token log-probs, finish reasons."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


class EngineError(RuntimeError):
    """The rollout engine failed (crashed, returned garbage, or a weight sync timed out)."""


@dataclass
class Generation:
    token_ids: list[int]
    """Response tokens; EOS included when the response stopped."""
    logprobs: list[float]
    """The engine's log-prob of each token (raw distribution, temperature 1)."""
    finish_reason: str
    """``stop`` (EOS) or ``length`` (hit max_tokens: truncated)."""


class RolloutEngine(Protocol):
    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        seeds: list[int] | None = None,
    ) -> list[list[Generation]]:
        """``n`` samples for each prompt, in prompt order. ``seeds`` (one per prompt) makes each
        prompt's samples depend on its own seed only, not on the batch it came in: the same
        run on any number of engines then samples the same responses."""

    def sync_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load the trainer's weights (all tensors, output layer included)."""

    def sleep(self) -> None:
        """Free accelerator memory during the update (no-op where unsupported)."""

    def wake(self) -> None:
        """Undo :meth:`sleep` before the next generation."""

    def shutdown(self) -> None:
        """Release the engine now (a no-op unless the engine holds processes or groups)."""


def check_generations(out: list[list[Generation]], n_prompts: int, n: int, max_tokens: int) -> None:
    """Reject malformed engine output with a clear error instead of training on it."""
    if len(out) != n_prompts:
        raise EngineError(f"engine returned {len(out)} prompt results for {n_prompts} prompts")
    for i, gens in enumerate(out):
        if len(gens) != n:
            raise EngineError(f"prompt {i}: engine returned {len(gens)} samples, expected {n}")
        for g in gens:
            if len(g.token_ids) != len(g.logprobs) or not g.token_ids or len(g.token_ids) > max_tokens:
                raise EngineError(
                    f"prompt {i}: malformed sample ({len(g.token_ids)} tokens, "
                    f"{len(g.logprobs)} log-probs, max_tokens={max_tokens})"
                )
            if g.finish_reason not in ("stop", "length"):
                raise EngineError(f"prompt {i}: unexpected finish reason {g.finish_reason!r}")
