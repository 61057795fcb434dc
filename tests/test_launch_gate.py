import json
import os
import subprocess
from pathlib import Path

import pytest
from scale_support import need

need("yaml")

from scale.config import load  # noqa: E402
from scale.ops import gate  # noqa: E402
from scale.ops.launch import main as launch_main  # noqa: E402
from scale.ops.launch import slurm_script, torchrun_command  # noqa: E402


def _summary(
    tmp_path, primary="reproduced", control="no effect (as expected)", blocks=("discovery", "confirmation")
):
    s = {
        "experiments": {
            "entropy_collapse": {
                "verdict": primary,
                "contrasts": [
                    {
                        "name": "p",
                        "role": "primary",
                        "verdict": primary,
                        "blocks": {b: {"verdict": primary} for b in blocks},
                    },
                    {"name": "c", "role": "control", "verdict": control},
                ],
            }
        }
    }
    f = tmp_path / "summary.json"
    f.write_text(json.dumps(s))
    return f


def _loss_check(path, cfg, passed=True, knobs=None, spec=None, source=None):
    """A toy check's JSON (``dapo toy check --json``) of the config's loss, at its knobs."""
    from dapo.registry import KNOBS, resolve, source_hash

    spec = spec or cfg.algo.policy_loss
    result = {
        "loss": spec,
        "source_hash": source or source_hash(resolve(spec)),
        "knobs": knobs or {k: getattr(cfg.algo, k) for k in KNOBS},
        "passed": passed,
        "failures": [] if passed else ["claims to protect against entropy_collapse but harms"],
        "modes": {
            "entropy_collapse": {"claimed": True, "protection": "protects" if passed else "harms"},
            "zero_gradient": {"claimed": False, "protection": "no effect"},
        },
    }
    path = Path(path)
    path.write_text(json.dumps({"command": f"dapo toy check {spec}", "results": [result]}))
    return path


def test_gate_write_check_and_refusals(tmp_path, monkeypatch):
    monkeypatch.setattr(gate, "git_state", lambda cwd=None: ("abc123" * 6, False))
    cfg = load("qwen2.5-32b-dapo")
    d = tmp_path / "gate"
    chk = _loss_check(tmp_path / "check.json", cfg)
    with pytest.raises(gate.GateError, match="no toy gate"):
        gate.check(cfg, d)
    with pytest.raises(gate.GateError, match="primary 'p' reversed"):
        gate.write(cfg, _summary(tmp_path, primary="reversed"), d, chk)
    with pytest.raises(gate.GateError, match="control"):
        gate.write(cfg, _summary(tmp_path, control="EFFECT IN CONTROL"), d, chk)
    with pytest.raises(gate.GateError, match="primary 'p' has no confirmation block"):
        gate.write(cfg, _summary(tmp_path, blocks=("discovery",)), d, chk)
    path = gate.write(cfg, _summary(tmp_path), d, chk)
    assert json.loads(path.read_text())["algo_hash"] == gate.algo_hash(cfg)
    assert gate.check(cfg, d)["commit"].startswith("abc123")
    other = load("qwen2.5-32b-dapo", ["algo.eps_high=0.3"])
    with pytest.raises(gate.GateError, match="another algo config"):
        gate.check(other, d)
    monkeypatch.setattr(gate, "git_state", lambda cwd=None: ("abc123" * 6, True))
    with pytest.raises(gate.GateError, match="uncommitted"):
        gate.check(cfg, d)
    monkeypatch.setattr(gate, "git_state", lambda cwd=None: ("def456" * 6, False))
    with pytest.raises(gate.GateError, match="no toy gate for commit def456"):
        gate.check(cfg, d)
    # outside a checkout: said so, not "uncommitted changes (unknown)"
    monkeypatch.undo()
    assert gate.git_state(tmp_path) == ("unknown", True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(gate.GateError, match=r"is not inside a git checkout") as err:
        gate.check(cfg, d)
    assert "uncommitted" not in str(err.value)


USER_LOSS = """
from dapo.loss import policy_loss


def my_loss(logp, old_logp, advantages, mask, clip, *, is_weights=None):
    return policy_loss(logp, old_logp, advantages, mask, clip, is_weights=is_weights)
"""


def test_the_gate_follows_the_loss(tmp_path, monkeypatch):
    """A record holds the loss its check was for: another loss, an edit of the loss's module
    after its check, a check at other knobs and a failed check are each refused, naming the
    loss and the commands to run."""
    from dapo.registry import resolve

    monkeypatch.setattr(gate, "git_state", lambda cwd=None: ("abc123" * 6, False))
    module = tmp_path / "gate_user_loss.py"
    module.write_text(USER_LOSS)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = "gate_user_loss:my_loss"
    cfg = load("qwen2.5-32b-dapo", [f"algo.policy_loss={spec}"])
    d = tmp_path / "gate"
    record = json.loads(
        gate.write(cfg, _summary(tmp_path), d, _loss_check(tmp_path / "c.json", cfg)).read_text()
    )
    entry = record["losses"][spec]
    assert entry["passed"] and entry["claims"] == {"entropy_collapse": "protects"}
    assert gate.check(cfg, d)["losses"][spec]["source_hash"] == entry["source_hash"]
    # the built-in loss was never checked at this commit: refused, by name
    with pytest.raises(
        gate.GateError, match="no toy check of loss 'dapo' at this commit.*dapo toy check --config"
    ):
        gate.check(load("qwen2.5-32b-dapo"), d)
    # the user's module edited after its check (a helper changed, not the function)
    module.write_text(USER_LOSS + "\nSCALE = 2.0\n")
    resolve.cache_clear()
    monkeypatch.delitem(__import__("sys").modules, "gate_user_loss")
    with pytest.raises(gate.GateError, match=f"loss '{spec}' changed since its toy check"):
        gate.check(cfg, d)
    # a check of another source of the loss (edited between the check and the gate): not recorded
    with pytest.raises(gate.GateError, match=f"loss '{spec}' changed since this check"):
        gate.write(cfg, _summary(tmp_path), d, _loss_check(tmp_path / "s.json", cfg, source="0" * 16))
    # a check at other knobs than the config runs the loss with: not recorded
    knobs = {"eps_low": 0.2, "eps_high": 0.2, "clip_ratio_c": 10.0, "loss_agg": "token-mean"}
    with pytest.raises(gate.GateError, match="was checked at .* the config runs it at"):
        gate.write(cfg, _summary(tmp_path), d, _loss_check(tmp_path / "k.json", cfg, knobs=knobs))
    with pytest.raises(gate.GateError, match=f"holds no check of loss '{spec}'.*it checked: dapo"):
        gate.write(cfg, _summary(tmp_path), d, _loss_check(tmp_path / "o.json", cfg, spec="dapo"))
    # a failed check is recorded as failed, and the run refused with what failed
    with pytest.raises(gate.GateError, match="failed its toy check"):
        gate.write(cfg, _summary(tmp_path), d, _loss_check(tmp_path / "f.json", cfg, passed=False))
    with pytest.raises(gate.GateError, match=f"loss '{spec}' failed its toy check .*harms"):
        gate.check(cfg, d)
    resolve.cache_clear()


def test_train_refuses_without_gate_and_records_force(tmp_path, monkeypatch, capsys):
    from scale.ops.cli import train_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gate, "git_state", lambda cwd=None: ("0" * 40, False))
    out = tmp_path / "o"
    assert train_main(["--config", "tiny-cpu", f"output.dir={out}", "--require-gate"]) == 5
    err = capsys.readouterr().err
    assert "refusing to start" in err and "no toy gate" in err and "--force" in err
    assert not (out / "metrics.jsonl").exists()


def _fake_tools(tmp_path: Path) -> dict[str, str]:
    """A PATH whose scontrol, srun, accelerate and torchrun only print what they were given
    (one argument per line), so that a launch can be run as printed, variables expanded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {
        "scontrol": 'printf "node-a\\nnode-b\\n"',
        "srun": 'shift; "$@"',  # drop --kill-on-bad-exit=1, run the node command here
        "accelerate": 'printf "%s\\n" accelerate "$@"',
        "torchrun": 'printf "%s\\n" torchrun "$@"',
    }
    for name, body in tools.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/bash\n{body}\n")
        tool.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_NODEID": "1",
    }


def test_launch_scripts_run_as_printed(tmp_path, capsys):
    """``bash -n`` on the SLURM script, then a dry run with stand-in tools: the variables expand
    on the node (not quoted away) and an override with shell characters arrives intact."""
    overrides = ["train.steps=10", "output.dir=runs/it's here"]
    out = tmp_path / "job.sbatch"
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "16", "--out", str(out), *overrides]) == 0
    script = out.read_text()
    assert (
        script.startswith("#!/bin/bash")
        and "#SBATCH --nodes=16" in script
        and "#SBATCH --gpus-per-node=8" in script
    )
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    env = _fake_tools(tmp_path)
    r = subprocess.run(["bash", str(out)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    argv = r.stdout.splitlines()
    assert argv[0] == "accelerate" and argv[argv.index("--num_machines") + 1] == "16"
    assert argv[argv.index("--num_processes") + 1] == "128"
    assert argv[argv.index("--machine_rank") + 1] == "1"  # $SLURM_NODEID, expanded on the node
    assert argv[argv.index("--main_process_ip") + 1] == "node-a"  # $MASTER_ADDR from scontrol
    assert argv[-len(overrides) :] == overrides
    assert argv[argv.index("-m") + 1 : argv.index("-m") + 6] == [
        "dapo.cli", "train", "--config", "qwen2.5-32b-dapo", "--resume",
    ]  # fmt: skip

    for scheduler in ("torchrun", "accelerate"):
        assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "2", "--scheduler", scheduler]) == 0
        line = capsys.readouterr().out
        r = subprocess.run(
            ["bash", "-c", line],
            capture_output=True,
            text=True,
            env={**env, "MASTER_ADDR": "10.1.2.3", "NODE_RANK": "0"},
        )
        assert r.returncode == 0, r.stderr
        argv = r.stdout.splitlines()
        assert argv[0] == scheduler and "$" not in r.stdout
        assert "10.1.2.3:29500" in argv or "10.1.2.3" in argv

    cmd = torchrun_command("qwen2.5-32b-dapo", 2, 8, "node0", [])
    assert cmd[:7] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "--max-restarts", "3"]
    assert "node0:29500" in cmd and cmd[cmd.index("--resume") + 1] == "auto"
    # restarts: within the job by the launcher (a failed rank), across node loss by SLURM
    script = slurm_script("qwen2.5-32b-dapo", 16, 8, [], max_restarts=5)
    assert "#SBATCH --requeue" in script and "#SBATCH --open-mode=append" in script
    assert "--max_restarts 5" in script and "--resume auto" in script
    assert (
        launch_main(
            ["--config", "qwen2.5-32b-dapo", "--nodes", "2", "--scheduler", "torchrun", "--max-restarts", "0"]
        )
        == 0
    )
    line = capsys.readouterr().out
    assert "--max-restarts 0" in line
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "3"]) == 2  # 512 groups over 24 GPUs
    assert "not divisible" in capsys.readouterr().err
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in slurm_script("qwen2.5-32b-dapo", 16, 8, [])


def test_accelerate_configs_are_valid_yaml():
    import yaml

    from scale.ops.launch import LAUNCH_DIR

    multi = yaml.safe_load((LAUNCH_DIR / "multinode.yaml").read_text())
    # accelerate only starts the processes: FSDP2, precision and timeouts come from the run
    # config, so a torchrun launch (which reads no accelerate file) trains the same way
    assert multi["distributed_type"] == "MULTI_GPU" and multi["num_processes"] == 128
    assert "fsdp_config" not in multi and multi["mixed_precision"] == "no"
    from scale.config import load

    cfg = load("qwen2.5-32b-dapo")
    assert cfg.train.sharding == "fsdp2" and cfg.train.mixed_precision == "bf16"
    assert cfg.model.dtype == "float32" and cfg.rollout.dtype == "bfloat16"
    assert cfg.train.dist_timeout_s > 16 * 60  # above the longest generation round
    assert yaml.safe_load((LAUNCH_DIR / "ddp_cpu.yaml").read_text())["use_cpu"] is True


def test_launch_places_a_disaggregated_run_on_one_node(capsys):
    """The generators start on rank 0's node after its learners: torchrun gets the GPUs left
    to train on; more nodes, or no GPU left, is one line and exit 2."""
    from test_plan import DISAGGREGATED as dis

    assert (
        launch_main(
            [
                "--config",
                "qwen2.5-32b-dapo",
                "--nodes",
                "1",
                "--gpus-per-node",
                "8",
                "--scheduler",
                "torchrun",
                *dis,
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "--nproc-per-node 6" in out and "6 learner GPU(s) and 2 generator GPU(s)" in err
    # SLURM: the job holds the whole node (the generators' GPUs exist in it) and starts 6 learners
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "1", "--gpus-per-node", "8", *dis]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --gpus-per-node=8" in script
    assert "--num_processes 6" in script and "--num_machines 1" in script
    assert "GPUs 6-7" in script
    from scale.placement.disaggregated import generator_gpus

    assert generator_gpus(8, 6, 2) == ([6, 7], False)  # what rank 0 then sees: its own GPUs for them
    # tensor-parallel generators: 2 x TP 2 take 4 GPUs, 4 learners train; the 32B preset at TP 2
    tp2 = [*dis[:-1], "rollout.tensor_parallel=2", "algo.train_groups=4", "algo.mini_batch_groups=4"]
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "1", "--gpus-per-node", "8", *tp2]) == 0
    out, err = capsys.readouterr()
    assert "4 learner GPU(s) and 4 generator GPU(s)" in err and "#SBATCH --gpus-per-node=8" in out
    assert "--num_processes 4" in out and "GPUs 4-7" in out
    assert generator_gpus(8, 4, 2, 2) == ([4, 5, 6, 7], False)
    tp4 = [*dis[:-1], "rollout.tensor_parallel=4"]
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "1", "--gpus-per-node", "8", *tp4]) == 2
    assert "at rollout.tensor_parallel=4 leaves no GPU of 8" in capsys.readouterr().err
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "2", *dis]) == 2
    assert "one node" in capsys.readouterr().err
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "1", "--gpus-per-node", "2", *dis]) == 2
    assert "leaves no GPU" in capsys.readouterr().err


def test_one_commits_gate_holds_every_rung_written_for_it(tmp_path, monkeypatch):
    """The toy gate applies to every preset: writing it for the one-GPU and the one-node rungs
    keeps the 32B preset's, and a config never written for stays refused."""
    monkeypatch.setattr(gate, "git_state", lambda cwd=None: ("abc123" * 6, False))
    d = tmp_path / "gate"
    rungs = [load(n) for n in ("qwen2.5-32b-dapo", "qwen2.5-math-7b-dapo", "qwen2.5-math-1.5b-dapo")]
    assert len({gate.algo_hash(c) for c in rungs}) == 3
    for i, cfg in enumerate(rungs):
        gate.write(cfg, _summary(tmp_path), d, _loss_check(tmp_path / f"check{i}.json", cfg))
        for written in rungs[: i + 1]:
            assert gate.check(written, d)["commit"].startswith("abc123")
        for unwritten in rungs[i + 1 :]:
            with pytest.raises(gate.GateError, match="another algo config"):
                gate.check(unwritten, d)
    (only,) = d.glob("*.json")
    assert len(json.loads(only.read_text())["algo_hashes"]) == 3


def test_gate_write_ends_with_the_verdicts_figures_and_what_the_gate_is(tmp_path, monkeypatch, capsys):
    """`nox -s toy` ends with `dapo gate write`: its output is the closing block, the four
    verdicts, where the figures are, one sentence on the gate and where it was written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gate, "git_state", lambda cwd=None: ("abc123" * 6, False))
    (tmp_path / "runs" / "toy").mkdir(parents=True)
    summary = _summary(tmp_path / "runs" / "toy")
    (tmp_path / "runs" / "toy" / "entropy_collapse").mkdir()
    (tmp_path / "runs" / "toy" / "entropy_collapse" / "entropy_collapse.png").write_bytes(b"")
    (tmp_path / "runs" / "ladder").mkdir()
    (tmp_path / "runs" / "ladder" / "ladder.png").write_bytes(b"")
    _loss_check(tmp_path / "runs" / "toy" / "check.json", load("qwen2.5-32b-dapo"))
    assert gate.main(["write", "--config", "qwen2.5-32b-dapo", "--toy-summary", str(summary)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("== the four failure modes")
    assert lines[1].split()[:2] == ["entropy_collapse", "reproduced"]
    figures = lines[lines.index("== figures") + 1 : -2]
    assert [Path(f.strip()).name for f in figures] == ["entropy_collapse.png", "ladder.png"]
    assert lines[-2].startswith("== the toy gate:") and "--require-gate" in lines[-2]
    assert lines[-1] == f"   gate written: {Path('runs/gate') / ('abc123' * 6 + '.json')}"
    # refused: the verdicts still come first, the reason on stderr
    bad = _summary(tmp_path / "runs" / "toy", primary="reversed")
    assert gate.main(["write", "--config", "qwen2.5-32b-dapo", "--toy-summary", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[:2] == ["entropy_collapse", "reversed"] and "did not pass" in err


GENERATOR_NODES = [
    "rollout.mode=disaggregated",
    "rollout.generators=24",
    "rollout.generator_nodes=12",
    "rollout.max_staleness=1",
    "eval.every=0",
]
"""The 32B preset's disaggregated variant (docs/presets.md) on 16 nodes: 4 learner nodes, 12
generator nodes of two tensor-parallel-4 generators each."""


@pytest.mark.parametrize("learners_fail", [False, True])
def test_launch_starts_generator_nodes_as_a_job_step_of_their_own(tmp_path, capsys, learners_fail):
    """rollout.generator_nodes: the SLURM job's last nodes run one agent each (a background job
    step), the first ones the learners; the job ends with the learners' status, stopping the
    agents when the learners failed. Run as printed with stand-in tools."""
    out = tmp_path / "job.sbatch"
    assert (
        launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "16", "--out", str(out), *GENERATOR_NODES])
        == 0
    )
    assert (
        "4 learner node(s) x 8 GPUs, 12 generator node(s) x 8 GPUs (2 generator(s) each)"
        in capsys.readouterr().err
    )
    script = out.read_text()
    assert "#SBATCH --nodes=16" in script and subprocess.run(["bash", "-n", str(out)]).returncode == 0
    env = _fake_tools(tmp_path)
    bin_dir = Path(env["PATH"].split(":")[0])
    tools = {
        "srun": 'while [[ "$1" == --* ]]; do shift; done; SLURM_PROCID=0 "$@"',  # the step's first task, here
        "python": 'printf "%s\\n" python "$@" > "$AGENT_OUT"',
        "accelerate": 'printf "%s\\n" accelerate "$@"; exit "${ACCELERATE_STATUS:-0}"',
    }
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    agent_out = tmp_path / "agent.txt"
    r = subprocess.run(
        ["bash", str(out)],
        capture_output=True,
        text=True,
        env={**env, "AGENT_OUT": str(agent_out), "ACCELERATE_STATUS": "3" if learners_fail else "0"},
    )
    assert r.returncode == (3 if learners_fail else 0), r.stderr
    argv = r.stdout.splitlines()
    assert argv[argv.index("--num_machines") + 1] == "4" and argv[argv.index("--num_processes") + 1] == "32"
    agent = agent_out.read_text().splitlines()
    assert agent[:3] == ["python", "-m", "scale.placement.generator_node"]
    assert agent[agent.index("--master") + 1] == "node-a" and agent[agent.index("--node") + 1] == "0"
    assert agent[agent.index("--port") + 1] == argv[argv.index("--main_process_port") + 1]  # one store


def test_launch_refuses_generator_nodes_that_leave_nothing_to_train_on(capsys):
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "12", *GENERATOR_NODES]) == 2
    assert "rollout.generator_nodes=12 leaves no node of --nodes 12 to train on" in capsys.readouterr().err
    wide = [*GENERATOR_NODES[:1], "rollout.generators=48", *GENERATOR_NODES[2:]]  # 4 x TP 4 per node
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "16", *wide]) == 2
    assert "need 16 GPUs per node; --gpus-per-node is 8" in capsys.readouterr().err
    assert (
        launch_main(
            ["--config", "qwen2.5-32b-dapo", "--nodes", "16", "--scheduler", "torchrun", *GENERATOR_NODES]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "--nnodes 4" in out and '--node "$GENERATOR_NODE"' in out and "GENERATOR_NODE=0..11" in out
