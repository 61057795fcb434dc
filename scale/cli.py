"""``dapo train`` and ``dapo eval``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def train_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="dapo train", description="DAPO training from a YAML config (accelerate + vLLM)."
    )
    p.add_argument(
        "--config", required=True, help="a YAML file or a bundled preset: tiny-cpu, qwen2.5-32b-dapo"
    )
    p.add_argument("overrides", nargs="*", help="section.field=value (value parsed as YAML)")
    p.add_argument(
        "--resume", default=None, help="'auto' (latest checkpoint of output.dir) or a checkpoint dir"
    )
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps of this invocation")
    p.add_argument(
        "--validate-only", action="store_true", help="check the config and the data files, then exit"
    )
    p.add_argument(
        "--require-gate",
        action="store_true",
        help="refuse to start unless the toy gate passed for this commit and algo config",
    )
    p.add_argument("--force", action="store_true", help="start without a matching gate (recorded in the run)")
    args = p.parse_args(argv)

    from .config import load_for_cli
    from .data import DataError

    cfg = load_for_cli("dapo train", args.config, args.overrides)
    if cfg is None:
        return 2
    if args.validate_only:
        return _validate_data(cfg)
    gate = {"required": args.require_gate}
    if args.require_gate:
        from .gate import GateError, check

        try:
            gate["record"] = check(cfg)
        except GateError as err:
            if not args.force:
                print(
                    f"dapo train: refusing to start: {err}\n(--force overrides; it is recorded in the run)",
                    file=sys.stderr,
                )
                return 5
            print(f"WARNING: STARTING WITHOUT A MATCHING TOY GATE (--force): {err}", file=sys.stderr)
            gate.update({"forced": True, "reason": str(err)})
    Path(cfg.output.dir).mkdir(parents=True, exist_ok=True)
    (Path(cfg.output.dir) / "gate.json").write_text(json.dumps(gate, indent=2, default=str))
    _ensure_tiny(cfg)
    from .engines import EngineError
    from .topology import preload_collective_modules, shutdown
    from .trainer import Trainer

    preload_collective_modules()  # before accelerate creates the process group
    try:
        trainer = Trainer(cfg, resume=args.resume)
        trainer.train(args.steps)
    except (DataError, FileExistsError) as err:
        print(f"dapo train: {err}", file=sys.stderr)
        return 2
    except EngineError as err:
        print(
            f"dapo train: rollout engine failed: {err}\nResume with --resume auto from the last checkpoint "
            f"under {cfg.output.dir}/checkpoints.",
            file=sys.stderr,
        )
        return 4
    trainer.close()
    del trainer
    leaked = shutdown()
    if leaked:  # such a process can end in a SIGABRT at interpreter exit (scale/topology.py)
        print(f"dapo train: warning: gloo threads {leaked} outlived the process group", file=sys.stderr)
    return 0


def _ensure_tiny(cfg) -> None:
    """The tiny-cpu preset builds its random model and data on first use."""
    from .tiny import build_tiny_data, build_tiny_model

    model = Path(cfg.model.path)
    if model.name == "tiny-model" and not model.exists():
        build_tiny_model(model)
    data = Path(cfg.data.train)
    if data.parent.name == "tiny-data" and not data.exists():
        build_tiny_data(data.parent)


def _validate_data(cfg) -> int:
    from .data import DataError, load_problems

    try:
        for spec, split in ((cfg.data.train, cfg.data.train_split), (cfg.data.eval, cfg.data.eval_split)):
            if spec:
                n = len(
                    load_problems(
                        spec,
                        split=split,
                        prompt_key=cfg.data.prompt_key,
                        answer_key=cfg.data.answer_key,
                        template=cfg.data.template,
                    )
                )
                print(f"{spec}: {n} valid records")
    except (DataError, FileNotFoundError) as err:
        print(f"dapo train: {err}", file=sys.stderr)
        return 2
    print("config and data are valid")
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="dapo eval", description="avg@k, pass@k and cons@k on integer-answer problems."
    )
    p.add_argument("--model", required=True, help="model directory (e.g. a checkpoint) or hub id")
    p.add_argument("--data", required=True, help="evaluation problems (.jsonl/.json/.parquet or hub id)")
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.7)
    p.add_argument("--max-new-tokens", type=int, default=20480)
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--template", choices=["dapo", "none"], default="dapo")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the summary and predictions as JSON here")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from .data import DataError, load_problems
    from .engines import make_engine
    from .evaluation import ProblemResult, canonical_prediction, summarize

    tok = AutoTokenizer.from_pretrained(args.model)
    try:
        problems = load_problems(args.data, template=args.template)
    except (DataError, FileNotFoundError) as err:
        print(f"dapo eval: {err}", file=sys.stderr)
        return 2
    problems = problems[: args.limit] if args.limit else problems
    prompts = [tok(p.prompt).input_ids for p in problems]
    if args.engine == "hf":
        from transformers import AutoModelForCausalLM

        dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(args.dtype, torch.float32)
        lm = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
        engine = make_engine(
            "hf", model=lm, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id or tok.eos_token_id
        )
    else:
        engine = make_engine(
            "vllm",
            model_path=args.model,
            dtype=args.dtype,
            max_model_len=max(map(len, prompts)) + args.max_new_tokens,
            gpu_memory_utilization=args.gpu_memory_utilization,
            seed=args.seed,
        )
    gens = engine.generate(
        prompts,
        n=args.k,
        max_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    results = [
        ProblemResult(
            p.answer, [canonical_prediction(tok.decode(g.token_ids, skip_special_tokens=True)) for g in row]
        )
        for p, row in zip(problems, gens)
    ]
    summary = summarize(results)
    for k, v in summary.items():
        if not k.endswith(("_lo", "_hi")):
            lo, hi = summary.get(f"{k}_lo"), summary.get(f"{k}_hi")
            ci = f"  [{lo:.3f}, {hi:.3f}]" if lo is not None else ""
            print(f"{k:<16} {v:.4f}{ci}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "summary": summary,
                    "settings": {k: str(v) for k, v in vars(args).items()},
                    "predictions": [
                        {"source": p.source, "row": p.row, "answer": p.answer, "predictions": r.predictions}
                        for p, r in zip(problems, results)
                    ],
                },
                indent=2,
            )
        )
    return 0
