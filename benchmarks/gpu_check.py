"""The GPU check: what only a GPU can show about the full regime, in one short script.

A randomly initialised Qwen2.5-0.5B-shaped model (built from its config, no download) goes
through the trainer's own code on the GPU(s):

1. FSDP2 with fp32 masters and bf16 compute (:func:`scale.sharding.build_policy`), one DAPO
   update on a synthetic batch with packed token-budget micro-batches
   (:func:`scale.trainer.run_update`): peak memory, time, that the weights moved;
2. the streaming weight sync (:func:`scale.sync.sync`) into a bf16 engine: vLLM when it is
   installed (sleep level 1; weights woken before the sync, KV cache after), else a bf16
   transformers copy standing in for it; sync time, the sync's peak extra memory, and the
   largest tensor;
3. generation by that engine and the engine/trainer log-prob gap on the generated tokens.

Writes JSON (``--out``, default ``$OUT/gpu_check.json`` or benchmarks/results/gpu_check.json).
Run on one node: ``torchrun --standalone --nproc-per-node <GPUs> benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN25_05B = dict(
    vocab_size=151_936,
    hidden_size=896,
    intermediate_size=4_864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32_768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=151_643,
    eos_token_id=151_643,
)


def _gib(n: float) -> float:
    return round(n / (1 << 30), 3)


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak() -> float | None:
    """Peak allocated GPU memory since the last reset (GiB); None on a CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    return _gib(torch.cuda.max_memory_allocated())


def build_model(path: Path, shape: dict[str, Any]) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from scale.tiny import build_tiny_model

    cfg = Qwen2Config(**shape)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok_dir = build_tiny_model(path.parent / "tok", format_steps=0)  # any tokenizer: ids are synthetic
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(path)


def synthetic_batch(groups: int, group_size: int, prompt: int, response: int, vocab: int, seed: int):  # type: ignore[no-untyped-def]
    import torch

    from dapo import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    b = groups * group_size
    lengths = torch.randint(response // 8, response + 1, (b,), generator=g)
    mask = torch.arange(response).unsqueeze(0) < lengths.unsqueeze(1)
    resp = torch.where(
        mask, torch.randint(10, vocab, (b, response), generator=g), torch.zeros(b, response, dtype=torch.long)
    )
    plen = torch.full((b,), prompt)
    prompts = torch.randint(10, vocab, (b, prompt), generator=g)
    correct = torch.rand(b, generator=g) < 0.5
    logp = torch.where(mask, -torch.rand(b, response, generator=g), torch.zeros(b, response))
    return RolloutBatch(
        old_logp=logp.clone(),
        rollout_logp=logp,
        mask=mask,
        lengths=lengths,
        truncated=lengths == response,
        correct=correct,
        rewards=torch.where(correct, 1.0, -1.0),
        group_ids=torch.arange(groups).repeat_interleave(group_size),
        group_size=group_size,
        extras={"prompt_ids": prompts, "prompt_len": plen, "response_ids": resp},
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed.nn

    from dapo import AlgoConfig
    from scale.config import load
    from scale.sharding import build_policy
    from scale.sync import MIB, sync
    from scale.topology import make_accelerator
    from scale.trainer import run_update

    cuda = torch.cuda.is_available()
    report: dict[str, Any] = {"torch": torch.__version__, "cuda": cuda}
    if not cuda and not args.allow_cpu:
        report["error"] = (
            "no CUDA device: this check needs a GPU (--allow-cpu runs its code path on CPU, small)"
        )
        return report
    report["device"] = torch.cuda.get_device_name(0) if cuda else "cpu (--allow-cpu: the code path only)"
    shape = dict(QWEN25_05B)
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    if args.vocab:
        shape.update(vocab_size=args.vocab, bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1)
    report["model"] = shape
    # the same directory on every rank of the node (rank 0 writes the model there)
    tmp = Path(tempfile.gettempdir()) / f"dapo-gpu-check-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}"
    tmp.mkdir(parents=True, exist_ok=True)
    model_dir = tmp / "model"
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        t0 = time.perf_counter()
        build_model(model_dir, shape)
        report["build_s"] = round(time.perf_counter() - t0, 1)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not torch.distributed.is_initialized():  # FSDP2 even on one GPU: a group of one
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    cfg = load(
        "qwen2.5-32b-dapo",
        [
            f"model.path={model_dir}",
            "model.gradient_checkpointing=true",
            "train.fsdp_offload=false",
            f"train.max_tokens_per_micro_batch={args.max_tokens}",
            f"output.dir={tmp / 'run'}",
            "output.trackers=[]",
        ],
    )
    acc = make_accelerator(cfg)
    _reset_peak()
    t0 = time.perf_counter()
    policy, inner = build_policy(cfg, acc)
    report["load"] = {"seconds": round(time.perf_counter() - t0, 1), "peak_gib": _peak()}
    report["sharded"] = type(policy).__name__
    params = sum(p.numel() for p in inner.parameters())
    report["parameters"] = params
    optimizer = torch.optim.AdamW(inner.parameters(), lr=1e-6, weight_decay=0.1)
    before = {
        n: p.detach().full_tensor().float().cpu() if hasattr(p, "full_tensor") else p.detach().float().cpu()
        for n, p in list(inner.named_parameters())[:4]
    }
    algo = AlgoConfig(
        group_size=4,
        train_groups=args.groups,
        mini_batch_groups=args.groups,
        expected_len=args.response * 3 // 4,
        cache_len=args.response - args.response * 3 // 4,
        max_grad_norm=1.0,
        tis_cap=2.0,
    )
    batch = synthetic_batch(
        args.groups // acc.num_processes, 4, args.prompt, args.response, shape["vocab_size"], seed=rank
    )
    from torch.distributed.fsdp import FSDPModule

    _reset_peak()
    t0 = time.perf_counter()
    m = run_update(
        acc,
        policy,
        optimizer,
        algo,
        batch,
        1,
        0,
        max_tokens=args.max_tokens,
        sharded=isinstance(policy, FSDPModule),
    )
    peak_update = _peak()
    after = {
        n: p.detach().full_tensor().float().cpu() if hasattr(p, "full_tensor") else p.detach().float().cpu()
        for n, p in list(inner.named_parameters())[:4]
    }
    moved = sum(int((after[n] != before[n]).sum()) for n in before) / sum(before[n].numel() for n in before)
    report["update"] = {
        "seconds": round(time.perf_counter() - t0, 2),
        "peak_gib": peak_update,
        "responses": batch.size,
        "response_tokens": int(batch.lengths.sum()),
        "optimizer_steps": m["actor/optimizer_steps"],
        "grad_norm": m.get("actor/grad_norm"),
        "loss": m.get("actor/loss"),
        "fraction_of_weights_moved_lr_1e-6": moved,
    }

    # the engine: vLLM if installed, else a bf16 transformers copy standing in for it
    engine_kind = "vllm"
    try:
        import vllm  # noqa: F401
    except ImportError:
        engine_kind = "hf-bf16-stand-in (vLLM not installed)"
    if not cuda:
        engine_kind = "hf-bf16-stand-in (CPU run)"
    report["engine"] = engine_kind
    prompts = [batch.extras["prompt_ids"][i, : args.prompt].tolist() for i in range(2)]
    if engine_kind == "vllm" and cuda:
        from scale.engines import make_engine

        engine = make_engine(
            "vllm",
            model_path=str(model_dir),
            dtype="bfloat16",
            max_model_len=args.prompt + 64,
            gpu_memory_utilization=0.3,
            seed=0,
            sleep_during_training=True,
            distributed=acc.num_processes > 1,
            dummy_weights=True,
        )
        engine.sleep()
    else:
        from transformers import AutoModelForCausalLM

        from scale.engines import make_engine

        stand_in = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(acc.device)

        class StandIn:
            def sync_weights(self, stream):  # type: ignore[no-untyped-def]
                own = dict(stand_in.named_parameters())
                for name, t in stream:
                    if name in own:
                        own[name].data.copy_(t)

        engine = StandIn()
    stats = sync(engine, inner.lm, dtype=torch.bfloat16, device=acc.device, bucket_mb=args.bucket_mb)
    report["sync"] = {
        "seconds": round(stats.seconds, 3),
        "peak_extra_gib": _gib(stats.peak_bytes),
        "largest_tensor_gib": _gib(stats.largest_tensor_bytes),
        "bucket_gib": _gib(args.bucket_mb * MIB),
        "within_2x_bucket_or_largest": stats.peak_bytes
        <= 2 * max(args.bucket_mb * MIB, stats.largest_tensor_bytes),
        "bytes_gib": _gib(stats.bytes),
    }
    if engine_kind == "vllm" and cuda:
        gens = engine.generate(prompts, n=2, max_tokens=32, temperature=1.0, top_p=1.0, seed=0)
        flat = [(p, g) for p, row in zip(prompts, gens) for g in row]
        engine_logp = [torch.tensor(g.logprobs) for _, g in flat]
        tokens = [g.token_ids for _, g in flat]
        engine.shutdown()
    else:
        eng = make_engine("hf", model=stand_in, eos_id=shape["eos_token_id"], pad_id=0)
        gens = eng.generate(prompts, n=2, max_tokens=32, temperature=1.0, top_p=1.0, seed=0)
        flat = [(p, g) for p, row in zip(prompts, gens) for g in row]
        tokens = [g.token_ids for _, g in flat]
        engine_logp = [torch.tensor(g.logprobs) for _, g in flat]
    # the trainer's log-probs of the same tokens (bf16 compute, as in training)
    gaps = []
    with torch.no_grad():
        for (p, _), toks, elp in zip(flat, tokens, engine_logp):
            lp, _ = policy(
                torch.tensor([p]),
                torch.tensor([len(p)]),
                torch.tensor([toks]),
                0,
                response_len=torch.tensor([len(toks)]),
            )
            gaps.append(float((lp[0, : len(toks)].float().cpu() - elp).abs().max()))
    report["generation"] = {
        "responses": len(flat),
        "tokens": sum(map(len, tokens)),
        "logp_gap_max": max(gaps),
        "logp_gap_mean_of_max": sum(gaps) / len(gaps),
    }
    report["peak_gib_total"] = _peak()
    del policy, inner, optimizer
    acc.free_memory()
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: Qwen2.5-0.5B's 24)")
    ap.add_argument("--groups", type=int, default=4, help="prompt groups of 4 responses in the update")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=8192, help="train.max_tokens_per_micro_batch")
    ap.add_argument("--bucket-mb", type=float, default=256.0, help="rollout.sync_bucket_mb")
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary (default: Qwen2.5's 151,936)")
    ap.add_argument("--allow-cpu", action="store_true", help="run the code path on CPU (small shapes)")
    args = ap.parse_args()
    out = args.out or (
        Path(os.environ["OUT"]) / "gpu_check.json"
        if os.environ.get("OUT")
        else ROOT / "benchmarks/results/gpu_check.json"
    )
    rank = int(os.environ.get("RANK", "0"))
    try:
        report = run(args)
    except Exception as err:  # this rank failed: say what, and end now (the others are ended by torchrun)
        report = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
        print(f"gpu_check rank {rank}: {report['error']}\n{report['traceback']}", file=sys.stderr)
    report["command"] = " ".join(sys.argv)
    if rank == 0:
        out.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(
            report, indent=2, default=lambda x: None if isinstance(x, float) and math.isnan(x) else str(x)
        )
        out.write_text(text + "\n")
        print(text)
    if "error" in report:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    from scale.topology import shutdown

    shutdown()
    return 1 if "error" in report else 0


if __name__ == "__main__":
    sys.exit(main())
