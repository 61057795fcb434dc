"""The readers against logs as people publish them, built from real calibration logs by the
ways real files get damaged or wrapped: a stray NUL byte in an NCCL debug line, ANSI colours,
CR progress redraws and Windows line ends, a 700 KB config dump before the first metric line
(a W&B-captured ``output.log``), status lines that look like dicts, a log that starts mid-run,
a file that is no log at all. Each must read to the same rows as the clean log, or be refused
with the formats tried, never with a parse error from a reader that does not fit."""

import json
import pprint
import subprocess
import sys
from pathlib import Path

import pytest

from dapo.health import diagnose, verdict
from dapo.health.readers import READERS, RunLogError, read_runs

ROOT = Path(__file__).parents[1]
CAL = ROOT / "tests" / "data" / "health" / "calibration"
FMT = ROOT / "tests" / "data" / "health" / "formats"
VERL = CAL / "verl-data-qwen2-7b-grpo-gsm8k.log"
TRL = CAL / "website-sanitizer-qwen0.5b-grpo-truncation.log"
CUSTOM = CAL / "monarch-grpo-run3-not-learning.log"


def rows(path, fmt="auto"):
    runs, _, got = read_runs(path, fmt)
    (run,) = runs.values()
    return run, got


def noisy(text: str) -> bytes:
    """NCCL debug lines (with a NUL byte), ANSI colours, CRLF line ends, a status line redrawn
    with CRs, interleaved with the lines of ``text``."""
    out = []
    for i, line in enumerate(text.splitlines()):
        if i % 7 == 0:
            out.append(f"node-3:1234:5678 [0] NCCL INFO Channel {i:02d}/24 : 0[0] -> 1[1] via P2P/IPC\x00")
            out.append(f"\rLoading safetensors shards: {i % 100}% done\r")
        out.append(f"\x1b[36m(TaskRunner pid=99)\x1b[0m {line}" if "step:" in line else line)
    return "\r\n".join(out).encode() + b"\r\n"


@pytest.mark.parametrize("clean", [VERL, TRL, CUSTOM], ids=["verl", "trl", "custom-kv"])
def test_binary_bytes_colours_and_redraws_do_not_change_a_single_row(clean, tmp_path):
    damaged = tmp_path / clean.name
    damaged.write_bytes(noisy(clean.read_text()))
    assert b"\x00" in damaged.read_bytes()
    assert rows(damaged) == rows(clean)


def _verl_preamble(kib: int) -> str:
    """What precedes verl's first metric line in a W&B-captured console: the config, printed
    once with pprint (nested dicts, some on one line with keys any reader knows: ``kl``,
    ``clip_ratio``, ``loss``), then engine start-up chatter, to ``kib`` KiB."""
    config = {
        "actor_rollout_ref": {
            "actor": {"clip_ratio": 0.2, "entropy_coeff": 0.0, "loss_agg_mode": "token-mean", "kl": 0.001},
            "rollout": {"n": 16, "temperature": 1.0, "response_length": 20480},
            "ref": {"log_prob_micro_batch_size": 8},
        },
        "algorithm": {"adv_estimator": "grpo", "kl_ctrl": {"type": "fixed", "kl_coef": 0.001}},
        "reward_model": {"loss": 0.0, "reward": 1, "overlong_buffer": {"len": 4096, "penalty_factor": 1.0}},
        "trainer": {"total_training_steps": 105, "logger": ["console", "wandb"]},
    }
    head = pprint.pformat(config, width=100) + "\n(WorkerDict pid=1) {'loss': 'ignore', 'kl': 'n/a'}\n"
    chatter = "(WorkerDict pid=2204, ip=10.0.0.7) INFO 01-01 00:00:00 [gpu_model_runner.py:1234] Loading weights took 3.1 s\n"
    return head + chatter * (kib * 1024 // len(chatter) + 1)


def test_a_wandb_output_log_with_a_700_kb_preamble_is_read_as_verl(tmp_path):
    """A W&B-captured ``files/output.log``: verl's config dump first, the metric lines after 700 KB."""
    run_dir = tmp_path / "wandb" / "run-20250101_000000-abcd1234"
    (run_dir / "files").mkdir(parents=True)
    (run_dir / "files" / "output.log").write_text(_verl_preamble(700) + VERL.read_text())
    assert (run_dir / "files" / "output.log").stat().st_size > 700_000
    got, fmt = rows(run_dir)  # the run directory itself
    assert fmt == "verl-console" and got == rows(VERL)[0]


def test_a_custom_trainer_log_with_dict_shaped_status_lines(tmp_path):
    """A status line that is a dict but not a literal (``<Status.OK: 1>``) once made the TRL
    reader raise; the custom trainer's ``step:N | key=value`` rows are what the file holds."""
    text = CUSTOM.read_text().splitlines()
    text.insert(3, "{'status': <Status.OK: 1>, 'learner': 'ready'}")
    f = tmp_path / "training.log"
    f.write_text("\n".join(text) + "\n")
    run, fmt = rows(f)
    assert fmt == "custom-kv" and run == rows(CUSTOM)[0] and len(run) == 233
    assert run[5]["actor/ref_kl"] >= 0 and "rollout/reward_mean" in run[5] and "actor/grad_norm" in run[5]


def test_a_log_that_starts_mid_run_is_said_to(tmp_path):
    from dapo.health.verdict import run_notes

    lines = [line for line in VERL.read_text().splitlines() if "step:" in line]
    resumed = [line for line in lines if int(line.split("step:")[1].split()[0]) >= 60]
    f = tmp_path / "resumed.log"
    f.write_text("\n".join(resumed) + "\n")
    run, _ = rows(f)
    assert run[0]["step"] == 60
    assert "starts at step 60" in run_notes(run)[0]
    assert run_notes(rows(VERL)[0]) == []


@pytest.mark.parametrize(
    "content",
    [
        (ROOT / "README.md").read_bytes(),
        (ROOT / "pyproject.toml").read_bytes(),
        b"",
        b"\x00\x01\x02\x03" * 4096,
        b"{'loss': ..., 'grad_norm': ...}\nstep:3 - actor/entropy:high\n",
    ],
    ids=["README", "pyproject", "empty", "binary", "ellipsis"],
)
def test_a_file_that_is_no_log_is_refused_with_the_formats_tried(content, tmp_path):
    f = tmp_path / "file.txt"
    f.write_bytes(content)
    with pytest.raises(RunLogError) as err:
        read_runs(f)
    msg = str(err.value)
    assert "not a log format this tool reads" in msg and all(name in msg for name in READERS)
    r = subprocess.run(
        [sys.executable, "-m", "dapo.cli", "diagnose", str(f)], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "tried" in r.stderr


def test_a_log_still_being_written_ends_mid_line(tmp_path):
    text = VERL.read_text()
    cut = text[: text.rindex("step:") + 40]  # the last line half written
    f = tmp_path / "live.log"
    f.write_text(cut)
    run, _ = rows(f)
    assert len(run) >= len(rows(VERL)[0]) - 1


def test_the_wandb_offline_run_reads_as_the_console_log_it_came_from():
    """``make_samples.py wandb-offline``: the verl run logged through ``wandb`` itself, offline."""
    pytest.importorskip("wandb")
    run, fmt = rows(FMT / "wandb-offline")  # the directory training ran in (it holds wandb/)
    assert fmt == "wandb-offline" and run == rows(VERL)[0]
    (file,) = (FMT / "wandb-offline").rglob("*.wandb")
    assert rows(file)[0] == run and rows(file.parent)[0] == run
    assert [f.status for f in diagnose(run)] == [f.status for f in diagnose(rows(VERL)[0])]


def test_a_wandb_run_cut_mid_record_reads_what_it_holds_and_says_so(tmp_path):
    pytest.importorskip("wandb")
    (file,) = (FMT / "wandb-offline").rglob("*.wandb")
    data = file.read_bytes()
    cut = tmp_path / "run-cut.wandb"
    cut.write_bytes(data[: len(data) // 2])
    runs, notes, _ = read_runs(cut)
    assert 0 < len(runs["run"]) < len(rows(VERL)[0]) and "partial record" in " ".join(notes)
    bad = bytearray(data)
    bad[200] ^= 0xFF  # a flipped byte inside the first records
    broken = tmp_path / "run-bad.wandb"
    broken.write_bytes(bytes(bad))
    with pytest.raises(RunLogError, match="checksum"):
        read_runs(broken)


def test_a_run_made_now_by_the_installed_wandb_reads_back(tmp_path):
    """The installed ``wandb`` (not only the committed sample's version) writes what we read."""
    wandb = pytest.importorskip("wandb")
    code = (
        "import wandb, math\n"
        f"run = wandb.init(mode='offline', dir={str(tmp_path)!r}, project='p')\n"
        "for s in range(1, 31):\n"
        "    run.log({'critic/score/mean': s / 30, 'actor/entropy': 1 - s / 60, "
        "'actor/grad_norm': math.nan if s == 7 else 1.0}, step=s)\n"
        "run.finish()\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"WANDB_SILENT": "true", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=120,
    )
    assert r.returncode == 0, (wandb.__version__, r.stderr[-2000:])
    run, fmt = rows(tmp_path)
    assert fmt == "wandb-offline" and [x["step"] for x in run] == list(range(1, 31))
    assert run[9]["rollout/reward_mean"] == pytest.approx(10 / 30)
    assert "actor/grad_norm" in run[6] and run[6]["actor/grad_norm"] != run[6]["actor/grad_norm"]  # NaN kept
    f = next(x for x in diagnose(run) if x.rule == "gradients")
    assert f.status == "failing" and "non-finite" in f.evidence


def test_the_project_metrics_jsonl_keeps_its_strict_errors(tmp_path):
    """A structured format stays strict: a bad line of metrics.jsonl is named, not skipped."""
    f = tmp_path / "metrics.jsonl"
    f.write_text(json.dumps({"step": 1, "actor/entropy": 1.0}) + "\n{oops\n" + json.dumps({"step": 3}) + "\n")
    with pytest.raises(RunLogError, match=r"metrics.jsonl:2: not valid JSON"):
        read_runs(tmp_path)


def test_levels_need_one_row_trends_need_windows(tmp_path):
    """The verl issue: 2 steps, the score 0 and every one of 128 groups all wrong. No trend can
    be judged, but there is no gradient at all: failing, not inconclusive."""
    line = (
        "(TaskRunner pid=1) step:{s} - batch/solve_none:128.000 - batch/solve_all:0.000 - "
        "batch/solve_partial:0.000 - critic/score/mean:0.000 - critic/score/max:0.000 - "
        "critic/score/min:0.000 - actor/entropy:0.52 - response_length/mean:812.0 - "
        "response_length/clip_ratio:0.03 - actor/grad_norm:0.0\n"
    )
    f = tmp_path / "score0.log"
    f.write_text("".join(line.format(s=s) for s in (1, 2)))
    run, _ = rows(f)
    fs = {x.rule: x for x in diagnose(run)}
    assert verdict(list(fs.values())).status == "failing"
    assert fs["not_learning"].status == "failing" and "floor" in fs["not_learning"].evidence
    assert fs["vanishing_signal"].status == "failing"
    assert fs["entropy_collapse"].status == "unknown"  # a trend: not from 2 rows


def test_a_users_own_names_and_mean_std_pairs(tmp_path):
    """TRL #986: the reporter logged ``ppo_response_length`` as ``"mean|std"`` strings."""
    f = tmp_path / "mine.jsonl"
    f.write_text(
        "".join(json.dumps({"step": s, "ppo_response_length": f"{60 - s}.5|3.2"}) + "\n" for s in range(1, 6))
    )
    run, fmt = rows(f)
    assert fmt == "jsonl" and [r["rollout/length_mean"] for r in run] == [59.5, 58.5, 57.5, 56.5, 55.5]
