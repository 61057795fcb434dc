"""dapo.health.readers on real logs in each format, and on malformed ones."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dapo.health import diagnose
from dapo.health.readers import READERS, RunLogError, detect, read_runs

DATA = Path(__file__).parent / "data" / "health"
CAL, FMT = DATA / "calibration", DATA / "formats"


def one(path, fmt="auto"):
    runs, notes, got = read_runs(path, fmt)
    (run,) = runs.values()
    return run, notes, got


def at(run, step):
    return next(r for r in run if r["step"] == step)


def test_verl_console_as_printed():
    """``(main_task pid=...) step:N - key:value - ...`` with verl's old entropy name."""
    run, notes, fmt = one(CAL / "verl-data-qwen2-7b-grpo-gsm8k.log")
    assert fmt == "verl-console" and not notes
    assert [r["step"] for r in run] == list(range(106))
    assert run[0] == {"step": 0, "eval/score": 0.229}  # step 0 holds the first validation only
    r = at(run, 2)
    assert r["actor/entropy"] == 0.329  # actor/entropy_loss: the entropy before verl 0.4
    assert r["rollout/reward_mean"] == 0.252 and r["rollout/length_mean"] == 198.214
    assert r["actor/ref_kl"] == 0.009 and r["actor/approx_kl"] == 0.001  # kl_loss vs ppo_kl
    assert r["rollout/advantage_abs_max"] == 1.789
    run, _, fmt = one(CAL / "houkawa2-coderl-ppo.log")  # Ray prefix, gaps in the steps
    assert fmt == "verl-console" and run[0]["step"] == 1 and run[-1] == {"step": 1065, "eval/score": 0.14}


def test_trl_console_dicts_amid_progress_bars():
    run, notes, fmt = one(CAL / "website-sanitizer-qwen0.5b-grpo-truncation.log")
    assert fmt == "trl-console" and not notes
    assert [r["step"] for r in run][:3] == [10, 20, 30]  # from the progress bar beside each dict
    r = at(run, 10)
    assert r["actor/grad_norm"] == 421403.8125 and r["rollout/truncation_rate"] == 0.975
    assert r["rollout/length_mean"] == 124.95 and r["actor/ref_kl"] > 1e4
    assert all(r["rollout/truncation_rate"] == 1.0 for r in run if r["step"] >= 20)
    # sparse bars: steps from epoch x steps-per-epoch, and said so
    run, notes, _ = one(CAL / "ning-guo-hotpotqa-grpo.log")
    assert run[0]["step"] == 20 and "steps per epoch" in notes[0]
    assert sorted(r["step"] for r in run) == [r["step"] for r in run]
    # no bars at all: rows numbered, and said so
    run, notes, _ = one(CAL / "trl-3452-grpo-loss-zero.log")
    assert [r["step"] for r in run] == list(range(1, 9)) and "rows are numbered" in notes[0]
    # numbers printed as strings ('loss': '-0.1081'), and bars that are not beside their dicts
    # (stderr interleaved with stdout): the bars are set aside, steps come from the epochs
    run, notes, _ = one(CAL / "chaos-economy-grpo-truncated.log")
    assert all(isinstance(v, float) for r in run for k, v in r.items() if k != "step")
    assert [r["step"] for r in run] == list(range(5, 255, 5)) and "do not match" in notes[0]
    # the bar after each dict (the redraw), with epochs rounded to 0.0 early on
    run, notes, _ = one(CAL / "juncylu-trl-dapo.log")
    assert [r["step"] for r in run] == list(range(10, 500, 10)) and not notes
    # dicts glued to the bar, blank lines and debug text between
    run, notes, _ = one(CAL / "scu-tsc-grpo-reward-stuck.log")
    assert [r["step"] for r in run] == list(range(5, 105, 5)) and not notes


def test_trl_trainer_state_as_published():
    run, notes, fmt = one(FMT / "chaos-economy.trainer_state.json")
    assert fmt == "trl-state" and not notes
    assert [r["step"] for r in run] == list(range(5, 205, 5))
    assert {"rollout/truncation_rate", "rollout/groups_uniform", "actor/ref_kl", "actor/grad_norm"} <= set(
        run[0]
    )


def test_trl_trainer_state(tmp_path):
    state = {
        "global_step": 60,
        "log_history": [
            {
                "step": i,
                "entropy": 1.0 - 0.012 * i,
                "clip_ratio/high_mean": 0.01,
                "completions/mean_length": 100 + i,
                "frac_reward_zero_std": 0.2,
                "reward": 0.1,
                "grad_norm": 1.0,
                "learning_rate": 1e-6,
            }
            for i in range(60)
        ]
        + [{"eval_loss": 0.3, "step": 60}, {"train_runtime": 12.0, "epoch": 1.0, "step": 60}],
    }
    f = tmp_path / "trainer_state.json"
    f.write_text(json.dumps(state))
    run, _, fmt = one(f)
    assert fmt == "trl-state" and len(run) == 60 and run[5]["rollout/length_mean"] == 105
    assert run[0]["rollout/groups_uniform"] == 0.2 and "learning_rate" not in run[0]
    assert one(tmp_path)[2] == "trl-state"  # a run directory


def test_tensorboard_and_wandb_read_the_same_run_as_the_console():
    """One real run through each framework's writer: every format gives the same verdicts."""
    verl = [f.status for f in diagnose(one(CAL / "verl-data-qwen2-7b-grpo-gsm8k.log")[0])]
    for path, fmt in (
        (FMT / "tensorboard" / "verl", "tensorboard"),
        (FMT / "wandb-history.csv", "wandb-csv"),
    ):
        run, _, got = one(path)
        assert got == fmt and [f.status for f in diagnose(run)] == verl
    trl_run = one(CAL / "website-sanitizer-qwen0.5b-grpo-truncation.log")[0]
    tb_run = one(FMT / "tensorboard" / "trl")[0]  # train/ prefix from transformers' callback
    assert [r["actor/grad_norm"] for r in tb_run] == pytest.approx(
        [r["actor/grad_norm"] for r in trl_run], rel=1e-6
    )
    runs, _, fmt = read_runs(FMT / "wandb-panel.csv")  # a panel export: "<run> - <metric>" columns
    assert fmt == "wandb-csv" and list(runs) == ["qwen0.5b-grpo-lora"]
    assert runs["qwen0.5b-grpo-lora"][0] == {
        "step": 10.0,
        "rollout/reward_mean": 0.024219439923763277,
        "actor/grad_norm": 421403.8125,
    }


def test_wandb_json_and_openrlhf_names(tmp_path):
    rows = [
        {
            "_step": 3 * i,
            "train/global_step": i,
            "train/policy_loss": 0.1,
            "train/reward": 0.2 + 0.01 * i,
            "train/kl": 0.01,
            "train/response_length": 300.0,
        }
        for i in range(30)
    ]
    f = tmp_path / "history.json"
    f.write_text(json.dumps(rows))
    run, _, fmt = one(f)
    assert fmt == "wandb-json" and run[4]["step"] == 4  # train/global_step over W&B's _step
    assert run[4] == pytest.approx(
        {
            "step": 4.0,
            "actor/loss": 0.1,
            "rollout/reward_mean": 0.24,
            "actor/ref_kl": 0.01,
            "rollout/length_mean": 300.0,
        }
    )


def test_project_jsonl_and_verl_file_logger(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text(
        "".join(
            json.dumps({"step": i, "actor/entropy": 1.0, "actor/grad_norm": None}) + "\n" for i in range(3)
        )
    )
    run, _, fmt = one(tmp_path)
    assert fmt == "jsonl" and run[0] == {"step": 0.0, "actor/entropy": 1.0}
    v = tmp_path / "verl.jsonl"
    v.write_text(
        json.dumps(
            {
                "step": 1,
                "data": {
                    "response_length/clip_ratio": 0.25,
                    "batch/solve_none": 3,
                    "batch/solve_all": 1,
                    "batch/solve_partial": 12,
                },
            }
        )
        + "\n"
    )
    run, _, _ = one(v)
    assert run[0]["rollout/truncation_rate"] == 0.25
    assert run[0]["rollout/groups_all_wrong"] == 3 / 16 and run[0]["rollout/groups_all_correct"] == 1 / 16


def test_nonfinite_values_are_kept_as_evidence(tmp_path):
    f = tmp_path / "log.txt"
    f.write_text(
        "".join(
            f"step:{i} - actor/grad_norm:{'nan' if i == 5 else 0.5} - actor/entropy:0.4\n" for i in range(30)
        )
    )
    run, _, _ = one(f)
    assert math.isnan(at(run, 5)["actor/grad_norm"])
    g = next(x for x in diagnose(run) if x.rule == "gradients")
    assert g.status == "failing" and g.start_step == 5
    t = tmp_path / "trl.log"
    t.write_text(
        "".join(
            f" {i}%|#| {i}/30 [00:01<00:01, 1.0it/s]\n{{'loss': nan, 'grad_norm': {'inf' if i == 3 else 0.2}, 'epoch': {i / 30}}}\n"
            for i in range(1, 31)
        )
    )
    run, _, _ = one(t)
    assert math.isinf(at(run, 3)["actor/grad_norm"]) and math.isnan(at(run, 3)["actor/loss"])


def test_malformed_and_partial_logs(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"step": 0, "actor/entropy": 1.0}\nnot json\n{"step": 2}\n')
    with pytest.raises(RunLogError, match=r"m.jsonl:2: not valid JSON"):
        read_runs(f)
    f.write_text('{"step": 0, "actor/entropy": "high"}\n')
    with pytest.raises(RunLogError, match=r"m.jsonl:1: actor/entropy: expected a number"):
        read_runs(f)
    f.write_text('{"actor/entropy": 1.0}\n{"actor/entropy": 0.9}\n')  # no step anywhere: numbered, and said
    runs, notes, _ = read_runs(f)
    assert [r["step"] for r in runs["run"]] == [1, 2] and "rows are numbered 1..2" in notes[0]
    f.write_text('{"step": 0, "actor/entropy": 1.0}\n{"step": 1, "actor/entr}\n')  # cut mid-record
    runs, notes, _ = read_runs(f)
    assert len(runs["run"]) == 1 and "cut mid-record" in notes[0]
    f.write_text('{"step": 0, "actor/entropy": 1.0}\n{"step": 1, "actor/entr')  # still being written
    runs, notes, _ = read_runs(f)
    assert len(runs["run"]) == 1 and "partial last line" in notes[0]
    with pytest.raises(RunLogError, match="no such file"):
        read_runs(tmp_path / "nope.jsonl")
    c = tmp_path / "w.csv"
    c.write_text("_step,train/reward\n1,0.5\n2,0.5,9\n")
    with pytest.raises(RunLogError, match=r"w.csv:3: 3 cells, the header has 2"):
        read_runs(c)
    c.write_text("epoch,train/reward\n1,0.5\n")
    with pytest.raises(RunLogError, match=r"w.csv:1: no step column"):
        read_runs(c)
    with pytest.raises(RunLogError, match=r"--format verl-console"):
        read_runs(CAL / "website-sanitizer-qwen0.5b-grpo-truncation.log", "verl-console")


def test_unknown_format_names_the_formats_tried_and_the_first_line(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("Epoch 3 went fine, loss ok\nmore\n")
    with pytest.raises(RunLogError) as err:
        read_runs(f)
    msg = str(err.value)
    assert all(name in msg for name in READERS) and "'Epoch 3 went fine, loss ok'" in msg
    b = tmp_path / "blob.bin"
    b.write_bytes(b"\0\1\2" * 100)
    with pytest.raises(RunLogError, match="binary data"):
        read_runs(b)


def test_tables_a_script_prints_with_spaces_or_a_rule_under_the_header(tmp_path):
    """Two tables found in public logs the readers used to refuse: columns aligned with spaces
    with rows elided by '...' (a TRL issue), and a '|' table with a rule of dashes under its
    header at the end of a verbose custom-trainer log; a 'step 5 loss 0.3' line is a row of
    another format, never a header."""
    spaced = tmp_path / "issue.txt"
    spaced.write_text(
        "Step  loss  grad_norm  reward_mean  clipped_ratio  mean_length\n"
        "1     0     0          0            1.0            256\n"
        "2     0     0          0            1.0            256\n"
        "...\n"
        "10    0     0          0            1.0            256\n"
    )
    run, _, fmt = one(spaced)
    assert fmt == "hf-table" and [r["step"] for r in run] == [1, 2, 10]
    assert run[-1]["rollout/truncation_rate"] == 1.0 and run[-1]["rollout/length_mean"] == 256
    ruled = tmp_path / "debug.log"
    ruled.write_text(
        "🎯 FINAL SUMMARY:\n  Initial model performance: 0.4266\n\n📋 Per-step overview:\n"
        "Step |    Pre |      KL |  GradN\n"
        "--------------------------------\n"
        "   1 |  0.427 |  -0.484 |  20.18\n"
        "   2 |  0.391 |  -0.523 |  21.08\n"
        "   3 |  0.432 |  -0.492 |  19.25\n"
    )
    run, _, fmt = one(ruled)
    assert fmt == "hf-table" and [r["step"] for r in run] == [1, 2, 3]
    assert run[0]["actor/ref_kl"] == -0.484 and run[2]["actor/grad_norm"] == 19.25
    kv = tmp_path / "kv.log"
    kv.write_text("".join(f"step {i} loss {0.1 * i:.2f} reward {0.2 + 0.01 * i:.2f}\n" for i in range(1, 9)))
    with pytest.raises(RunLogError, match="no line is a metric row"):
        read_runs(kv)  # no header was made of its first row


def test_logs_of_the_third_held_out_batch_as_published():
    """What that batch found unread or misread: a TRL console log whose library configs print as
    dicts and whose epochs print as 0.0 for a third of the run (its steps are the bars beside
    the dicts, and its 0-or-2 'correctness' column is no accuracy); MiniMind's
    'Epoch:[1/1](12/500), Reward: ..., Actor Loss: ...' lines; a journal table with
    `backticked` names."""
    run, notes, fmt = one(CAL / "reasoning-rl-train5.log")
    assert fmt == "trl-console" and [r["step"] for r in run] == list(range(1, 101))
    assert not any("do not match" in n for n in notes) and any("not read as an accuracy" in n for n in notes)
    assert "rollout/accuracy" not in run[0] and run[2]["rollout/reward_mean"] == 1.5
    run, _, fmt = one(CAL / "minimind-grpo-v2-r1-rule-reward.log")
    assert fmt == "custom-kv" and [r["step"] for r in run][:3] == [1, 2, 3] and len(run) == 500
    r = run[0]
    assert r["rollout/reward_mean"] == 0.3846 and r["actor/ref_kl"] == 0.0004 and r["actor/loss"] == 0.0
    assert r["rollout/length_mean"] == 129
    run, _, fmt = one(CAL / "cs224r-verl-grpo-smoke-1p7b-steps8-12.md")
    assert fmt == "hf-table" and [r["step"] for r in run] == [8, 9, 10, 11, 12]
    assert run[2]["rollout/reward_mean"] == 0.053 and run[0]["actor/entropy"] == 1.197


def test_a_jsonl_config_record_is_skipped_and_a_row_without_a_step_is_named(tmp_path):
    f = tmp_path / "log.jsonl"
    f.write_text(
        '{"type": "config", "args": {"lr": 1e-05, "steps": 400}}\n'
        '{"step": 20, "mean_reward": 0.0, "loss": -0.03}\n{"step": 40, "mean_reward": 0.25, "loss": 0.004}\n'
    )
    run, notes, _ = one(f)
    assert [r["step"] for r in run] == [20, 40] and ":1: a record without a step or a metric" in notes[0]
    f.write_text('{"step": 20, "mean_reward": 0.0}\n{"mean_reward": 0.25}\n')
    with pytest.raises(RunLogError, match=r"log.jsonl:2: no 'step' field"):
        read_runs(f)


def test_each_sample_is_detected_as_its_format():
    expect = {
        CAL / "verl-data-deepseek-7b-ppo-gsm8k.log": "verl-console",
        CAL / "ning-guo-hotpotqa-grpo.log": "trl-console",
        CAL / "trl-986-ppo-response-length.jsonl": "jsonl",
        FMT / "wandb-history.csv": "wandb-csv",
        FMT / "tensorboard" / "trl": "tensorboard",
    }
    for path, name in expect.items():
        assert detect(path).name == name, path


def test_a_log_dict_is_never_evaluated(tmp_path):
    f = tmp_path / "evil.log"
    marker = tmp_path / "pwned"
    f.write_text(f"{{'loss': __import__('pathlib').Path('{marker}').touch(), 'grad_norm': 1.0}}\n")
    with pytest.raises(RunLogError, match=r"evil.log: not a log format this tool reads"):
        read_runs(f)
    with pytest.raises(RunLogError, match=r"evil.log:1: a dict that is not a Python literal"):
        read_runs(f, "trl-console")
    assert not marker.exists()


def test_tensorboard_without_the_package_is_one_clear_line(tmp_path):
    code = (
        "import sys, importlib.abc\n"
        "class B(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'tensorboard': raise ImportError(name)\n"
        "sys.meta_path.insert(0, B())\n"
        "from dapo.cli import main\n"
        f"sys.exit(main(['diagnose', {str(FMT / 'tensorboard' / 'verl')!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (
        r.returncode == 2 and "pip install 'dapo-repro[health]'" in r.stderr and "Traceback" not in r.stderr
    )
