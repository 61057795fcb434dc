"""``dapo launch``: the commands that start a multi-node run, with the environment it needs.

Prints (or writes) an accelerate, torchrun or SLURM launch for ``dapo train`` over
``--nodes`` x ``--gpus-per-node`` GPUs. Nothing here needs a GPU: tests check the
generated commands.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

LAUNCH_DIR = Path(__file__).parent / "launch"

ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    # fewer OOMs from fragmentation with vLLM colocated; vLLM >= 0.32 (the pin) switches it off
    # for its sleep-mode pool and back on after (vllm/device_allocator/cumem.py)
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "NCCL_DEBUG": "WARN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a dead rank ends the job instead of hanging it
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # vLLM in the trainer's process (colocated)
    "OMP_NUM_THREADS": "8",
}


_VAR = re.compile(r"\$(\{\w+\}|\w+)")


def shell_word(word: str) -> str:
    """``word`` quoted for a POSIX shell, leaving ``$VAR`` references expandable: a word with
    one goes in double quotes (``"$MASTER_ADDR:29500"``); any other in single quotes."""
    if _VAR.search(word):
        if re.search(r'["\\`]', word) or re.search(r"\$(?!\{?\w)", word):
            raise ValueError(f"cannot quote {word!r} for the shell and keep its variables")
        return f'"{word}"'
    return shlex.quote(word)


def shell_line(words: list[str]) -> str:
    return " ".join(shell_word(w) for w in words)


def train_args(config: str, overrides: list[str], require_gate: bool = True) -> list[str]:
    args = ["-m", "dapo.cli", "train", "--config", config, "--resume", "auto"]
    if require_gate:
        args.append("--require-gate")
    return args + list(overrides)


MAX_RESTARTS = 3
"""Restarts of the worker group after a rank fails, per job (``dapo launch --max-restarts``):
each resumes from the last checkpoint (:mod:`scale.ops.restart`), and a run that dies twice
at the same step stops at the next."""


def accelerate_command(
    config: str,
    nodes: int,
    gpus: int,
    rank: str,
    master: str,
    overrides: list[str],
    accelerate_config: Path = LAUNCH_DIR / "multinode.yaml",
    max_restarts: int = MAX_RESTARTS,
) -> list[str]:
    return [
        "accelerate",
        "launch",
        "--config_file",
        str(accelerate_config),
        "--max_restarts",
        str(max_restarts),
        "--num_machines",
        str(nodes),
        "--num_processes",
        str(nodes * gpus),
        "--machine_rank",
        rank,
        "--main_process_ip",
        master,
        "--main_process_port",
        "29500",
        *train_args(config, overrides),
    ]


def torchrun_command(
    config: str, nodes: int, gpus: int, master: str, overrides: list[str], max_restarts: int = MAX_RESTARTS
) -> list[str]:
    return [
        "torchrun",
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(gpus),
        "--max-restarts",
        str(max_restarts),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{master}:29500",
        "--rdzv-id",
        "dapo",
        *train_args(config, overrides),
    ]


PORT = 29500
"""The launcher's store (torchrun's rendezvous, accelerate's main process port), where a
generator node's agent meets the learners (:mod:`scale.placement.generator_node`)."""


def generator_node_command(master: str, node: str) -> list[str]:
    """The agent of generator node ``node`` (``rollout.generator_nodes``): it starts the node's
    share of the generators for each pool the learners announce in their launcher's store."""
    return [
        "python",
        "-m",
        "scale.placement.generator_node",
        "--master",
        master,
        "--port",
        str(PORT),
        "--node",
        node,
    ]


def slurm_script(
    config: str,
    nodes: int,
    gpus: int,
    overrides: list[str],
    partition: str | None = None,
    hours: int = 72,
    env: dict[str, str] | None = None,
    learners: int | None = None,
    max_restarts: int = MAX_RESTARTS,
    generator_nodes: int = 0,
) -> str:
    """An sbatch script that asks for ``gpus`` GPUs on each of ``nodes`` nodes (the whole node)
    and starts ``learners`` training processes per node (default: one per GPU). A disaggregated
    run starts fewer: its generators take the node's remaining GPUs, which SLURM must expose
    to the job too, or they would land on the learners' devices. With ``generator_nodes``, the
    allocation's last ``generator_nodes`` nodes generate: a job step of its own starts one agent
    on each (in the background), the first job step the learners on the others, and the job
    ends with the learners' status. A failed rank restarts the
    group within the job (``max_restarts``); a lost node requeues the job (``--requeue``), whose
    log is appended to, not replaced."""
    learners = gpus if learners is None else learners
    learner_nodes = nodes - generator_nodes
    cmd = accelerate_command(
        config, learner_nodes, learners, "$SLURM_NODEID", "$MASTER_ADDR", overrides, max_restarts=max_restarts
    )
    lines = [
        "#!/bin/bash",
        "#SBATCH --job-name=dapo",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus}",
        "#SBATCH --cpus-per-task=64",
        "#SBATCH --exclusive",
        f"#SBATCH --time={hours}:00:00",
        "#SBATCH --output=dapo-%j.out",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [
        "set -euo pipefail",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in (env or ENV).items()]
    if generator_nodes:
        agent = generator_node_command("$MASTER_ADDR", "$SLURM_PROCID")
        step = "--nodes={n} --ntasks={n} --ntasks-per-node=1 --relative={r}"
        lines += [
            f"# generator nodes {learner_nodes}-{nodes - 1}: one agent each (scale/placement/generator_node.py); "
            "they leave when the run is done",
            f"srun {step.format(n=generator_nodes, r=learner_nodes)} bash -c {shlex.quote(shell_line(agent))} &",
            "generators=$!",
            f"# learner nodes 0-{learner_nodes - 1}: one launcher per node; accelerate starts its {learners} "
            "training processes",
            "status=0",
            f"srun --kill-on-bad-exit=1 {step.format(n=learner_nodes, r=0)} bash -c "
            f"{shlex.quote(shell_line(cmd))} || status=$?",
            'if [ "$status" -ne 0 ]; then kill "$generators" 2>/dev/null || true; fi',
            'wait "$generators" || true',
            'exit "$status"',
        ]
        return "\n".join(lines) + "\n"
    lines += [
        "# one launcher per node; accelerate starts the node's training processes"
        + (
            f" ({learners} learners on GPUs 0-{learners - 1}; rank 0 starts the generators on GPUs "
            f"{learners}-{gpus - 1})"
            if learners < gpus
            else ""
        ),
        f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(shell_line(cmd))}",
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    from dapo.cliargs import InDir, Int, OutFile, Parser, Text

    from ..config import config_arguments

    ap = Parser(prog="dapo launch", description="Generate a multi-node launch for dapo train.")
    config_arguments(ap)
    ap.add_argument("--nodes", type=Int(lo=1), required=True, help="nodes, >= 1")
    ap.add_argument("--gpus-per-node", type=Int(lo=1), default=8, help="GPUs per node (default 8)")
    ap.add_argument(
        "--scheduler",
        choices=["slurm", "torchrun", "accelerate"],
        default="slurm",
        help="slurm: an sbatch script (default); torchrun / accelerate: the command to run on every node",
    )
    ap.add_argument(
        "--master",
        type=Text(),
        default="$MASTER_ADDR",
        help="address of node 0 (default $MASTER_ADDR, expanded by the shell on each node)",
    )
    ap.add_argument(
        "--rank",
        type=Text(),
        default="$NODE_RANK",
        help="this node's rank for accelerate (default $NODE_RANK, expanded by the shell)",
    )
    ap.add_argument("--partition", type=Text(), default=None, help="SLURM partition")
    ap.add_argument(
        "--max-restarts",
        type=Int(lo=0),
        default=MAX_RESTARTS,
        help=f"restarts of the training processes after one fails, each from the last checkpoint "
        f"(default {MAX_RESTARTS}; a run that dies twice at the same step stops)",
    )
    ap.add_argument(
        "--hours", type=Int(lo=1, hi=24 * 30), default=72, help="SLURM time limit in hours (default 72)"
    )
    ap.add_argument(
        "--staged",
        type=InDir(),
        default=None,
        help="a directory from dapo stage: its model and data paths, and the hub offline",
    )
    ap.add_argument(
        "--out", type=OutFile(), default=None, help="write the script here instead of printing it"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dapo.cliargs import UsageError

    from ..config import load_for_cli

    env_vars = dict(ENV)
    if args.staged is not None:  # the staged model and data, and no process touches the hub
        from .stage import read

        record = read(args.staged)
        args.overrides = [*record["overrides"], *args.overrides]
        env_vars.update(record["env"])
    cfg = load_for_cli("dapo launch", args.config, args.overrides)
    if cfg is None:
        return 2
    node_gpus = per_node = args.gpus_per_node
    gen_nodes = cfg.generator_nodes
    learner_nodes = args.nodes - gen_nodes
    if gen_nodes:  # generators on nodes of their own, started by an agent on each
        r = cfg.rollout
        gen_gpus = r.generators // gen_nodes * r.tensor_parallel
        if learner_nodes < 1:
            print(
                f"dapo launch: rollout.generator_nodes={gen_nodes} leaves no node of --nodes {args.nodes} "
                "to train on",
                file=sys.stderr,
            )
            return 2
        if gen_gpus > args.gpus_per_node:
            print(
                f"dapo launch: rollout.generators={r.generators} at rollout.tensor_parallel="
                f"{r.tensor_parallel} on {gen_nodes} generator node(s) need {gen_gpus} GPUs per node; "
                f"--gpus-per-node is {args.gpus_per_node}",
                file=sys.stderr,
            )
            return 2
        print(
            f"dapo launch: {learner_nodes} learner node(s) x {per_node} GPUs, {gen_nodes} generator "
            f"node(s) x {gen_gpus} GPUs ({r.generators // gen_nodes} generator(s) each)",
            file=sys.stderr,
        )
    elif cfg.disaggregated:  # rank 0 starts the generators on its node, on the GPUs after its learners'
        if args.nodes > 1:
            print(
                "dapo launch: rollout.mode=disaggregated with rollout.generator_nodes=0 places its "
                "generators on rank 0's node; launch it on one node (--nodes 1), or give the "
                "generators nodes of their own (rollout.generator_nodes)",
                file=sys.stderr,
            )
            return 2
        gen_gpus = cfg.rollout.generators * cfg.rollout.tensor_parallel
        per_node = args.gpus_per_node - gen_gpus
        if per_node < 1:
            print(
                f"dapo launch: rollout.generators={cfg.rollout.generators} at rollout.tensor_parallel="
                f"{cfg.rollout.tensor_parallel} leaves no GPU of {args.gpus_per_node} to train on",
                file=sys.stderr,
            )
            return 2
        print(
            f"dapo launch: {per_node} learner GPU(s) and {gen_gpus} generator GPU(s) on one node",
            file=sys.stderr,
        )
    args.gpus_per_node = per_node
    world = learner_nodes * args.gpus_per_node
    tp = 1 if cfg.disaggregated else cfg.rollout.tensor_parallel
    if world % tp or args.gpus_per_node % tp:
        print(f"dapo launch: rollout.tensor_parallel={tp} must divide the GPUs per node", file=sys.stderr)
        return 2
    # training shards over every GPU; generation over rollout groups of tp GPUs (scale/rollout.py)
    for name, total, parts, what in (
        ("algo.train_groups", cfg.algo.train_groups, world, "GPUs"),
        ("rollout.gen_groups", cfg.gen_groups, world // tp, f"rollout groups of {tp} GPUs"),
    ):
        if cfg.disaggregated and name == "rollout.gen_groups":
            continue  # the generators split the rounds (checked with the config)
        if total % parts:
            print(f"dapo launch: {name}={total} is not divisible by {parts} {what}", file=sys.stderr)
            return 2
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in env_vars.items())
    try:  # an override the shell cannot carry with its $VARs intact is refused by name
        if args.scheduler == "slurm":
            text = slurm_script(
                args.config,
                args.nodes,
                node_gpus,  # the whole node: the generators' GPUs too
                args.overrides,
                args.partition,
                args.hours,
                env_vars,
                learners=per_node,
                max_restarts=args.max_restarts,
                generator_nodes=gen_nodes,
            )
        else:
            words = (
                torchrun_command(
                    args.config,
                    learner_nodes,
                    args.gpus_per_node,
                    args.master,
                    args.overrides,
                    max_restarts=args.max_restarts,
                )
                if args.scheduler == "torchrun"
                else accelerate_command(
                    args.config,
                    learner_nodes,
                    args.gpus_per_node,
                    args.rank,
                    args.master,
                    args.overrides,
                    max_restarts=args.max_restarts,
                )
            )
            text = f"{env} {shell_line(words)}\n"
            if gen_nodes:
                agent = generator_node_command(args.master, "$GENERATOR_NODE")
                text = (
                    f"# on each of the {learner_nodes} learner node(s):\n{text}"
                    f"# on each of the {gen_nodes} generator node(s), GENERATOR_NODE=0..{gen_nodes - 1}:\n"
                    f"{env} {shell_line(agent)}\n"
                )
    except ValueError as err:
        raise UsageError(str(err)) from None
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0
