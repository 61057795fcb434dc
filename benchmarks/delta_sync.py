"""Benchmark: what a delta weight sync sends (``rollout.delta_sync``, :mod:`scale.dist.delta`)
against the whole model, per training step, at the presets' learning rates.

A random Qwen2 at Qwen2.5-0.5B's width (896, 14 heads, MLP 4,864; ``--layers`` decoder
layers, ``--vocab`` tokens) trains with AdamW on next-token
loss over random tokens (fp32 masters, as the trainer keeps them); after each step every
tensor is cast to the engine's dtype (bf16) and compared bit for bit with the version before.
Reports per step the share of changed elements and the bytes a delta sync sends (index and
value per changed element where that is smaller than the tensor, else the tensor) against
the whole model's bf16 bytes, at each ``--lr`` (the presets' 1e-6, and 1e-5 and 1e-4, where
LoRA runs). Weight decay is the presets' 0.1.
Writes benchmarks/results/delta_sync.json.

    python benchmarks/delta_sync.py [--layers 2] [--vocab 32768] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "delta_sync.json"


def model(layers: int, vocab: int, seed: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg)


def measure(
    lm: torch.nn.Module, lr: float, steps: int, seq: int, batch: int, seed: int
) -> list[dict[str, float]]:
    from scale.dist import delta

    opt = torch.optim.AdamW(lm.parameters(), lr=lr, weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    vocab = lm.config.vocab_size

    def engine() -> dict[str, torch.Tensor]:
        return {n: p.detach().to(torch.bfloat16) for n, p in lm.named_parameters()}

    before = engine()
    rows = []
    for step in range(1, steps + 1):
        ids = torch.randint(0, vocab, (batch, seq), generator=g)
        loss = lm(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        after = engine()
        elements = changed = full = sent = 0
        for name, t in after.items():
            n, size = t.numel(), t.numel() * t.element_size()
            c = delta.changed(before[name], t).numel()
            elements, changed, full = elements + n, changed + c, full + size
            sent += delta.PLAN_BYTES + delta.cost(n, c, t.element_size())[1]
        rows.append(
            {
                "step": step,
                "changed_share": changed / elements,
                "sent_share": sent / full,
                "loss": float(loss),
            }
        )
        before = after
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4])
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    results = {}
    for lr in args.lr:
        lm = model(args.layers, args.vocab, seed=0)
        results[f"{lr:g}"] = measure(lm, lr, args.steps, args.seq, args.batch, seed=1)
        last = results[f"{lr:g}"][-1]
        print(
            f"lr {lr:g}: changed {100 * last['changed_share']:.1f}% of bf16 elements at step {args.steps}, "
            f"a delta sync sends {100 * last['sent_share']:.1f}% of the whole model's bytes"
        )
    params = sum(p.numel() for p in model(args.layers, args.vocab, seed=0).parameters())
    report = {
        "command": "python benchmarks/delta_sync.py " + " ".join(sys.argv[1:]),
        "model": {"width": 896, "layers": args.layers, "vocab": args.vocab, "params": params},
        "weight_decay": 0.1,
        "by_lr": results,
        "seconds": round(time.perf_counter() - t0, 1),
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
