import json
import shlex

import pytest
from scale_support import need

need("yaml")

from scale import gate  # noqa: E402
from scale.config import load  # noqa: E402
from scale.launch import main as launch_main  # noqa: E402
from scale.launch import slurm_script, torchrun_command  # noqa: E402


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


def test_gate_write_check_and_refusals(tmp_path, monkeypatch):
    monkeypatch.setattr(gate, "git_state", lambda cwd=None: ("abc123" * 6, False))
    cfg = load("qwen2.5-32b-dapo")
    d = tmp_path / "gate"
    with pytest.raises(gate.GateError, match="no toy gate"):
        gate.check(cfg, d)
    with pytest.raises(gate.GateError, match="primary 'p' reversed"):
        gate.write(cfg, _summary(tmp_path, primary="reversed"), d)
    with pytest.raises(gate.GateError, match="control"):
        gate.write(cfg, _summary(tmp_path, control="EFFECT IN CONTROL"), d)
    with pytest.raises(gate.GateError, match="primary 'p' has no confirmation block"):
        gate.write(cfg, _summary(tmp_path, blocks=("discovery",)), d)
    path = gate.write(cfg, _summary(tmp_path), d)
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


def test_train_refuses_without_gate_and_records_force(tmp_path, monkeypatch, capsys):
    from scale.cli import train_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gate, "git_state", lambda cwd=None: ("0" * 40, False))
    out = tmp_path / "o"
    assert train_main(["--config", "tiny-cpu", f"output.dir={out}", "--require-gate"]) == 5
    err = capsys.readouterr().err
    assert "refusing to start" in err and "no toy gate" in err and "--force" in err
    assert not (out / "metrics.jsonl").exists()


def test_launch_scripts(tmp_path, capsys):
    script = slurm_script("qwen2.5-32b-dapo", 16, 8, ["train.steps=10"])
    assert "#SBATCH --nodes=16" in script and "#SBATCH --gpus-per-node=8" in script
    assert (
        "--num_machines 16 --num_processes 128 --machine_rank $SLURM_NODEID --main_process_ip $MASTER_ADDR"
        in script
    )
    assert "-m dapo.cli train --config qwen2.5-32b-dapo --resume auto --require-gate train.steps=10" in script
    assert "export VLLM_ENABLE_V1_MULTIPROCESSING=0" in script and "srun --kill-on-bad-exit=1" in script
    cmd = torchrun_command("qwen2.5-32b-dapo", 2, 8, "node0", [])
    assert cmd[:6] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend"]
    assert "node0:29500" in cmd
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "16", "--scheduler", "torchrun"]) == 0
    line = capsys.readouterr().out.strip()
    argv = shlex.split(line)
    assert argv[argv.index("--nnodes") + 1] == "16" and "dapo.cli" in argv
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "3"]) == 2  # 512 groups over 24 GPUs
    assert "not divisible" in capsys.readouterr().err
    out = tmp_path / "job.sbatch"
    assert launch_main(["--config", "qwen2.5-32b-dapo", "--nodes", "16", "--out", str(out)]) == 0
    assert out.read_text().startswith("#!/bin/bash")


def test_accelerate_configs_are_valid_yaml():
    import yaml

    from scale.launch import LAUNCH_DIR

    fsdp = yaml.safe_load((LAUNCH_DIR / "fsdp_multinode.yaml").read_text())
    assert fsdp["distributed_type"] == "FSDP" and fsdp["num_processes"] == 128
    assert fsdp["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "Qwen2DecoderLayer"
    assert yaml.safe_load((LAUNCH_DIR / "ddp_cpu.yaml").read_text())["use_cpu"] is True
