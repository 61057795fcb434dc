"""dapo stage and dapo launch --staged (scale/ops/stage.py): the model and data fetched once, the
run pointed at them with the hub offline; without staging, one process per node reads the
hub. The hub itself cannot be reached here: its two calls (snapshot_download,
datasets.load_dataset) are replaced by local copies of what they return."""

import json
import shutil
from pathlib import Path

import pytest
from scale_support import need

from dapo import cli
from scale.config import load
from scale.dist.hub import OFFLINE_ENV, hub_environment, is_hub_id


def test_hub_ids_and_local_paths(tmp_path):
    assert is_hub_id("Qwen/Qwen2.5-32B") and is_hub_id("BytedTsinghua-SIA/DAPO-Math-17k")
    (tmp_path / "m").mkdir()
    for local in (
        str(tmp_path / "m"),
        "data/train.jsonl",
        "a/b.parquet",
        "./x/y",
        "~/m/n",
        "/abs/dir",
        "single",
    ):
        assert not is_hub_id(local), local


def test_only_each_nodes_local_rank_0_reads_the_hub():
    cfg = load("qwen2.5-32b-dapo")
    assert hub_environment(cfg, 0) == {}
    assert hub_environment(cfg, 3) == OFFLINE_ENV
    local = load("qwen2.5-32b-dapo", ["model.path=/m", "data.train=/d/t.parquet", "data.eval=/d/e.parquet"])
    assert hub_environment(local, 3) == {}


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """snapshot_download copies a local model directory; load_dataset returns rows."""
    need("datasets", "huggingface_hub")
    import datasets
    import huggingface_hub

    from scale.ops.tiny import build_tiny_model

    source = build_tiny_model(tmp_path / "hub-model", format_steps=0)
    (source / "pytorch_model.bin").write_bytes(b"a duplicate a repository may hold")
    calls = []

    def snapshot_download(repo_id, local_dir, allow_patterns):
        import fnmatch

        calls.append(repo_id)
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        for f in source.iterdir():
            if any(fnmatch.fnmatch(f.name, p) for p in allow_patterns):
                shutil.copy(f, Path(local_dir) / f.name)
        return local_dir

    def load_dataset(spec, split):
        calls.append(f"{spec}[{split}]")
        rows = [
            {
                "prompt": [{"role": "user", "content": f"Q: {i} + 1 = ? Answer:"}],
                "reward_model": {"ground_truth": str(i + 1)},
            }
            for i in range(5)
        ]
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_stage_then_launch_staged_runs_offline_on_the_staged_files(fake_hub, tmp_path, capsys):
    staged = tmp_path / "staged"
    rc = cli.main(["stage", "--config", "qwen2.5-32b-dapo", "--dir", str(staged)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"dapo launch --staged {staged}" in out and "HF_HUB_OFFLINE=1" in out
    assert fake_hub == [
        "Qwen/Qwen2.5-32B",
        "BytedTsinghua-SIA/DAPO-Math-17k[train]",
        "BytedTsinghua-SIA/AIME-2024[train]",
    ]
    record = json.loads((staged / "stage.json").read_text())
    assert record["env"] == OFFLINE_ENV
    assert (staged / "model" / "config.json").is_file() and (staged / "model" / "model.safetensors").is_file()
    assert not (staged / "model" / "pytorch_model.bin").exists()  # only what a run reads
    from scale.generator.data import prepare_problems

    ps = prepare_problems(str(staged / "data" / "train.parquet"), chat_template=False)
    assert len(ps.problems) == 5 and ps.problems[0].answer == "1"
    # the staged run: every path local, so no rank needs the hub, and the launch says offline
    cfg = load("qwen2.5-32b-dapo", record["overrides"])
    assert not any(is_hub_id(s) for s in (cfg.model.path, cfg.data.train, cfg.data.eval))
    rc = cli.main(["launch", "--config", "qwen2.5-32b-dapo", "--nodes", "16", "--staged", str(staged)])
    script, err = capsys.readouterr()
    assert rc == 0, err
    assert "export HF_HUB_OFFLINE=1" in script and "export HF_DATASETS_OFFLINE=1" in script
    assert f"model.path={staged.resolve() / 'model'}" in script
    rc = cli.main(
        [
            "launch",
            "--config",
            "qwen2.5-32b-dapo",
            "--nodes",
            "2",
            "--scheduler",
            "torchrun",
            "--staged",
            str(staged),
        ]
    )
    line, _ = capsys.readouterr()
    assert rc == 0 and line.startswith("TOKENIZERS_PARALLELISM=false") and "HF_HUB_OFFLINE=1" in line


def test_launch_staged_refuses_a_directory_that_was_not_staged(tmp_path, capsys):
    rc = cli.main(["launch", "--config", "qwen2.5-32b-dapo", "--nodes", "2", "--staged", str(tmp_path)])
    _, err = capsys.readouterr()
    assert rc == 2 and "stage.json" in err and "run dapo stage first" in err and "Traceback" not in err
    rc = cli.main(
        ["launch", "--config", "qwen2.5-32b-dapo", "--nodes", "2", "--staged", str(tmp_path / "none")]
    )
    _, err = capsys.readouterr()
    assert rc == 2 and "--staged" in err and "no such directory" in err
