"""The trained policy as one module whose forward returns per-token log-probs and entropy
of response tokens, so DDP/FSDP hooks see a single entry point and the [tokens, vocab]
logits are never materialised (:func:`dapo.logprobs.chunked_logprobs`)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from dapo.logprobs import chunked_logprobs


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


class Policy(nn.Module):
    """Wraps a transformers causal LM (``.lm``) and computes response log-probs."""

    def __init__(self, lm: nn.Module, chunk: int = 1024):
        super().__init__()
        self.lm = lm
        self.chunk = chunk

    def output_weight(self) -> Tensor:
        return self.lm.get_output_embeddings().weight

    def forward(
        self, prompt_ids: Tensor, prompt_len: Tensor, response_ids: Tensor, pad_id: int
    ) -> tuple[Tensor, Tensor]:
        ids, attn, pos, p = pack(prompt_ids, prompt_len, response_ids, pad_id)
        base = self.lm.get_decoder() if hasattr(self.lm, "get_decoder") else self.lm.model
        hidden = base(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
        t = response_ids.shape[1]
        h = hidden[:, p - 1 : p - 1 + t]  # the state before each response token predicts it
        return chunked_logprobs(h, self.output_weight(), response_ids, chunk=self.chunk)

    def named_weights_for_engine(self) -> Iterator[tuple[str, Tensor]]:
        """Every tensor of the LM in checkpoint naming, the output layer included even when
        tied to the embeddings (leaving it out silently desynchronises vLLM's lm_head)."""
        state = self.lm.state_dict()
        for name, tensor in state.items():
            yield name, _full(tensor)
        if "lm_head.weight" not in state:
            yield "lm_head.weight", _full(self.output_weight())


def _full(t: Tensor) -> Tensor:
    """A whole tensor from a possibly sharded one (FSDP2 DTensor -> all-gathered)."""
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t
