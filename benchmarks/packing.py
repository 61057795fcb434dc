"""Benchmark: padded fixed-size micro-batches (the trainer's old path) against padding-free
(packed) micro-batches cut by a token budget, on a batch with DAPO-like length spread.

Response lengths are drawn log-uniform between 200 and 20,480 tokens (DAPO's 16k expected
length + 4k cache ceiling), prompts uniform in 100..300 tokens, both divided by ``--scale``
(64) so the forward runs on a CPU. Reported:

* tokens of trainer compute per response token: padded = sum over micro-batches of
  rows x (longest prompt + longest response) of the micro-batch; packed = the real prompt
  + response tokens. Averaged over ``--draws`` random batches (no model) and for the timed
  batch;
* attention score elements per response token: padded = sum of rows x L^2, packed with a
  dense block-diagonal mask (sdpa/eager) = N^2 per packed row, packed varlen
  (flash-attention on GPU) = sum of per-sequence len^2;
* wall time of forward + backward over all micro-batches of one batch on the tiny Qwen2
  (scale.ops.tiny.build_tiny_model, random weights), median of ``--repeats``, and the ratio
  packed / padded; the largest |logp| difference between the two paths on response tokens.

The packed budget is what the padded path must provision per forward in the worst case:
``micro_batch_size x (max prompt + max response)``. Writes benchmarks/results/packing.json.

    python benchmarks/packing.py [--batch 64] [--micro-batch-size 4] [--scale 64]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dapo.microbatch import token_budget_bins

PAD = 1


def draw_lengths(n: int, scale: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt and response lengths [n] (scaled, at least 1)."""
    lo, hi = math.log(200), math.log(20_480)
    resp = torch.exp(lo + (hi - lo) * torch.rand(n, generator=g))
    prompt = 100 + 200 * torch.rand(n, generator=g)
    return (prompt / scale).round().clamp(min=1).long(), (resp / scale).round().clamp(min=1).long()


def padded_parts(n: int, mbs: int) -> list[list[int]]:
    return [list(range(s, min(s + mbs, n))) for s in range(0, n, mbs)]


def costs(plen: torch.Tensor, rlen: torch.Tensor, mbs: int, budget: int) -> dict[str, float]:
    resp_tokens = float(rlen.sum())
    pad_tok = pad_att = 0.0
    for part in padded_parts(len(rlen), mbs):
        width = int(plen[part].max()) + int(rlen[part].max())
        pad_tok += len(part) * width
        pad_att += len(part) * width**2
    bins = token_budget_bins(plen + rlen, budget)
    pk_tok = pk_dense = 0.0
    for b in bins:
        n = int((plen[b] + rlen[b]).sum())
        pk_tok += n
        pk_dense += n**2
    varlen = float(((plen + rlen).double() ** 2).sum())
    return {
        "padded_tokens_per_response_token": pad_tok / resp_tokens,
        "packed_tokens_per_response_token": pk_tok / resp_tokens,
        "padded_attention_per_response_token": pad_att / resp_tokens,
        "packed_dense_mask_attention_per_response_token": pk_dense / resp_tokens,
        "packed_varlen_attention_per_response_token": varlen / resp_tokens,
        "padded_micro_batches": float(len(padded_parts(len(rlen), mbs))),
        "packed_micro_batches": float(len(bins)),
    }


def make_rows(plen: torch.Tensor, rlen: torch.Tensor, vocab: int, g: torch.Generator):
    p, t = int(plen.max()), int(rlen.max())
    prompt = torch.randint(3, vocab, (len(plen), p), generator=g)
    prompt[torch.arange(p) >= plen[:, None]] = PAD
    resp = torch.randint(3, vocab, (len(rlen), t), generator=g)
    resp[torch.arange(t) >= rlen[:, None]] = PAD
    return prompt, resp


def run_path(policy, prompt, plen, resp, rlen, parts, packed: bool) -> tuple[float, torch.Tensor]:
    """Forward + backward of every micro-batch (a loss on the response tokens); seconds and
    the [b, T] log-probs."""
    policy.zero_grad(set_to_none=True)
    out = torch.zeros(resp.shape)
    t0 = time.perf_counter()
    for part in parts:
        idx = torch.tensor(part, dtype=torch.long)
        if packed:
            lp, _ = policy(prompt[idx], plen[idx], resp[idx], PAD, response_len=rlen[idx])
            t = resp.shape[1]
        else:  # the old trainer path: trimmed to the micro-batch's longest prompt and response
            t = int(rlen[idx].max())
            p = int(plen[idx].max())
            lp, _ = policy(prompt[idx, :p], plen[idx], resp[idx, :t], PAD)
        mask = torch.arange(t) < rlen[idx, None]
        (lp * mask).sum().neg().backward()
        out[idx, :t] = lp.detach()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64, help="responses per batch")
    ap.add_argument("--micro-batch-size", type=int, default=4, help="rows per padded micro-batch")
    ap.add_argument("--scale", type=int, default=64, help="divide token lengths by this")
    ap.add_argument("--draws", type=int, default=200, help="random batches for the token counts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "packing.json")
    args = ap.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    mbs, scale = args.micro_batch_size, args.scale
    max_prompt, max_resp = round(300 / scale), round(20_480 / scale)
    budget = mbs * (max_prompt + max_resp)

    g = torch.Generator().manual_seed(args.seed)
    draws = [costs(*draw_lengths(args.batch, scale, g), mbs, budget) for _ in range(args.draws)]
    mean = {k: statistics.fmean(d[k] for d in draws) for k in draws[0]}

    from transformers import AutoModelForCausalLM

    from scale.learner.policy import Policy
    from scale.ops.tiny import build_tiny_model

    plen, rlen = draw_lengths(args.batch, scale, g)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "m", max_positions=2 * (max_prompt + max_resp), format_steps=0)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    policy = Policy(lm, chunk=1024)
    prompt, resp = make_rows(plen, rlen, lm.config.vocab_size, g)
    parts = {
        "padded": padded_parts(args.batch, mbs),
        "packed": token_budget_bins(plen + rlen, budget),
    }
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    logp = {}
    run_path(policy, prompt, plen, resp, rlen, parts["packed"][:1], True)  # warm-up
    for _ in range(args.repeats):
        for name in ("padded", "packed"):
            secs, logp[name] = run_path(policy, prompt, plen, resp, rlen, parts[name], name == "packed")
            times[name].append(secs)
    mask = torch.arange(resp.shape[1]) < rlen[:, None]
    diff = float((logp["padded"] - logp["packed"])[mask].abs().max())
    wall = {k: statistics.median(v) for k, v in times.items()}
    report = {
        "benchmark": "padded fixed-size micro-batches vs packed token-budget micro-batches (trainer forward + backward)",
        "command": "python " + " ".join(["benchmarks/packing.py", *sys.argv[1:]]),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seed": args.seed,
        "lengths": {
            "response": "log-uniform in [200, 20480] tokens / scale",
            "prompt": "uniform in [100, 300] tokens / scale",
            "scale": scale,
        },
        "batch": args.batch,
        "micro_batch_size": mbs,
        "token_budget": budget,
        f"mean_over_{args.draws}_batches": {k: round(v, 3) for k, v in mean.items()},
        "timed_batch": {
            **{k: round(v, 3) for k, v in costs(plen, rlen, mbs, budget).items()},
            "response_tokens": int(rlen.sum()),
            "wall_seconds_median": {k: round(v, 4) for k, v in wall.items()},
            "wall_seconds_all": {k: [round(x, 4) for x in v] for k, v in times.items()},
            "wall_ratio_packed_over_padded": round(wall["packed"] / wall["padded"], 3),
            "max_abs_logp_diff": diff,
        },
        "model": "tiny Qwen2 (hidden 128, 2 layers, vocab 24, sdpa), random weights",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
