"""Benchmark: trainer overhead of scale.trainer against TRL's GRPOTrainer, same tiny model,
same prompts, group size, completion length and generation backend (transformers
generate), so the ratio measures the trainer, not the engine. TRL is installed only in the
benchmark's environment (pip install trl). Writes benchmarks/results/trainer_vs_trl.json.

    python benchmarks/trainer_vs_trl.py [--steps 20]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

PROMPTS, G, MAX_NEW = 8, 4, 16


def ours(model: Path, data: Path, out: Path, steps: int) -> dict:
    from scale.config import load
    from scale.trainer import Trainer

    cfg = load(
        "tiny-cpu",
        [
            f"model.path={model}",
            f"data.train={data}",
            "data.eval=null",
            f"output.dir={out}",
            "rollout.engine=hf",
            f"algo.group_size={G}",
            f"algo.train_groups={PROMPTS}",
            f"algo.mini_batch_groups={PROMPTS}",
            "algo.dynamic_sampling=false",
            "algo.soft_overlong=false",
            "algo.overlong_filter=false",
            "algo.expected_len=12",
            "algo.cache_len=4",
            "algo.tis_cap=null",
            f"train.steps={steps + 2}",
            f"train.micro_batch_size={PROMPTS * G}",
            "output.checkpoint_every=0",
            "eval.every=0",
        ],
    )
    tr = Trainer(cfg, log=lambda *_: None)
    hist = tr.train()[2:]  # drop warm-up steps
    per = lambda k: statistics.mean(m[k] for m in hist)  # noqa: E731
    return {
        "seconds_per_step": round(per("time/step_s"), 4),
        "breakdown_seconds": {
            "generate": round(per("time/generate_s"), 4),
            "update (old log-probs + optimizer step)": round(per("time/update_s"), 4),
            "weight sync": round(per("time/sync_s"), 4),
        },
    }


def trl(model: Path, data: Path, out: Path, steps: int) -> dict:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from dapo.rewards import score_integer_answer

    rows = [json.loads(line) for line in data.read_text().splitlines()]
    ds = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": str(r["answer"])} for r in rows])

    def reward(completions, answer, **_):
        return [1.0 if score_integer_answer(c, a) else -1.0 for c, a in zip(completions, answer)]

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=PROMPTS * G,
        num_generations=G,
        max_completion_length=MAX_NEW,
        learning_rate=1e-3,
        max_steps=steps + 2,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        temperature=1.0,
        top_p=1.0,
        seed=0,
        dataloader_num_workers=0,
    )
    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model)
    trainer = GRPOTrainer(
        model=lm, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok, callbacks=[Clock()]
    )
    trainer.train()
    deltas = [b - a for a, b in itertools.pairwise(stamps)]
    return {"seconds_per_step": round(statistics.mean(deltas), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import torch
    import trl as trl_pkg

    from scale.ops.tiny import build_tiny_data, build_tiny_model

    tmp = Path(tempfile.mkdtemp())
    model = build_tiny_model(tmp / "tiny-model")
    train, _ = build_tiny_data(tmp / "tiny-data", n_train=64)
    torch.set_num_threads(2)
    a = ours(model, train, tmp / "ours", args.steps)
    b = trl(model, train, tmp / "trl", args.steps)
    report = {
        "benchmark": "seconds per training step, scale.trainer vs TRL GRPOTrainer (hf generate in both)",
        "command": f"python benchmarks/trainer_vs_trl.py --steps {args.steps}",
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "trl_version": trl_pkg.__version__,
        "prompts": PROMPTS,
        "group_size": G,
        "max_new_tokens": MAX_NEW,
        "measured_steps": args.steps,
        "ours": a,
        "trl": b,
        "ratio_ours_over_trl": round(a["seconds_per_step"] / b["seconds_per_step"], 3),
    }
    path = Path(__file__).parent / "results" / "trainer_vs_trl.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
