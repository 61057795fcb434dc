"""transformers ``generate`` as a rollout engine, for machines without vLLM. Colocated, it
samples from the trainer's own module, so no weight sync is needed; in a generator process
(``owns=True``) it holds its own copy, loaded tensor by tensor at each sync."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from .base import EngineError, Generation, check_generations


class HFEngine:
    def __init__(
        self, model: torch.nn.Module, eos_id: int, pad_id: int, batch_prompts: int = 64, owns: bool = False
    ):
        self.model = model
        self.owns = owns
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.batch_prompts = batch_prompts

    @torch.no_grad()
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
        out: list[list[Generation]] = []
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if seeds is not None:  # each prompt alone, from its own seed
                for p, s in zip(prompts, seeds, strict=True):
                    torch.manual_seed(s)
                    out.extend(self._batch([p], n, max_tokens, temperature, top_p, device))
            else:
                torch.manual_seed(seed)
                for s in range(0, len(prompts), self.batch_prompts):
                    out.extend(
                        self._batch(
                            prompts[s : s + self.batch_prompts], n, max_tokens, temperature, top_p, device
                        )
                    )
        self.model.train(was_training)
        check_generations(out, len(prompts), n, max_tokens)
        return out

    def _batch(self, prompts, n, max_tokens, temperature, top_p, device) -> list[list[Generation]]:
        p_max = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), p_max), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, p_max - len(p) :] = torch.tensor(p)
            attn[i, p_max - len(p) :] = 1
        res = self.model.generate(
            input_ids=ids.to(device),
            attention_mask=attn.to(device),
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            max_new_tokens=max_tokens,
            num_return_sequences=n,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        seqs = res.sequences[:, p_max:].cpu()
        logp = torch.stack([torch.log_softmax(x.float(), -1) for x in res.logits], dim=1).cpu()  # raw, T = 1
        tok_logp = logp.gather(-1, seqs[:, : logp.shape[1]].unsqueeze(-1)).squeeze(-1)
        gens = []
        for row in range(seqs.shape[0]):
            toks = seqs[row].tolist()
            stop = toks.index(self.eos_id) + 1 if self.eos_id in toks else None
            length = stop if stop is not None else min(len(toks), max_tokens)
            gens.append(
                Generation(toks[:length], tok_logp[row, :length].tolist(), "stop" if stop else "length")
            )
        return [gens[i * n : (i + 1) * n] for i in range(len(prompts))]

    @torch.no_grad()
    def sync_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Colocated: nothing to do (the engine samples from the trainer's module). Owning its
        model: copy each tensor in; every tensor of the model must arrive."""
        if not self.owns:
            return
        state = self.model.state_dict()
        seen = set()
        for name, t in named_tensors:
            if name not in state:
                raise EngineError(f"weight sync: the model has no tensor {name!r}")
            state[name].copy_(t.to(state[name].device, state[name].dtype))
            seen.add(name)
        missing = sorted(set(state) - seen)
        if missing:
            raise EngineError(f"weight sync left {len(missing)} tensor(s) stale, e.g. {missing[0]}")

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def shutdown(self) -> None:
        pass
