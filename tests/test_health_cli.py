"""``dapo diagnose``: exit statuses, the report and its figures, knobs, and --follow."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dapo.health.cli import EXIT_FAIL, EXIT_INCONCLUSIVE, main
from dapo.health.config import HealthConfig
from dapo.health.follow import follow

CAL = Path(__file__).parent / "data" / "health" / "calibration"


def rows(n, **metrics):
    return [{"step": i, **{k: (v(i) if callable(v) else v) for k, v in metrics.items()}} for i in range(n)]


def write(path, run):
    path.write_text("".join(json.dumps(r) + "\n" for r in run))
    return path


def test_exit_statuses(tmp_path, capsys):
    collapse = write(
        tmp_path / "c.jsonl",
        rows(
            60,
            **{
                "actor/entropy": lambda i: 1.0 if i < 20 else 0.2,
                "rollout/length_mean": 10.0,
                "rollout/truncation_rate": 0.0,
                "rollout/accuracy": 0.5,
                "actor/grad_norm": 0.3,
                "actor/approx_kl": 0.001,
            },
        ),
    )
    assert main([str(collapse)]) == 0
    out = capsys.readouterr().out
    assert "format: jsonl" in out and "failing  Entropy collapse since step 20" in out and "do:" in out
    assert main([str(collapse), "--fail-on", "failing"]) == EXIT_FAIL
    sparse = write(tmp_path / "s.jsonl", rows(40, **{"rollout/truncation_rate": 0.0}))
    assert main([str(sparse)]) == 0  # no gate asked for
    assert "inconclusive (8 of 9 rules could not judge: 8 not logged)" in capsys.readouterr().out
    assert main([str(sparse), "--fail-on", "failing"]) == EXIT_INCONCLUSIVE
    assert main([str(sparse), "--fail-on", "warning"]) == EXIT_INCONCLUSIVE
    healthy = write(
        tmp_path / "h.jsonl",
        rows(
            60,
            **{
                "actor/entropy": lambda i: 0.6 + 0.001 * (i % 3),
                "rollout/length_mean": 100.0,
                "rollout/truncation_rate": 0.0,
                "rollout/accuracy": lambda i: 0.2 + 0.01 * i,
                "rollout/groups_all_correct": 0.1,
                "rollout/groups_all_wrong": 0.1,
                "actor/grad_norm": 0.3,
                "actor/approx_kl": 0.001,
            },
        ),
    )
    assert main([str(healthy), "--fail-on", "warning"]) == 0
    capsys.readouterr()
    assert main([str(healthy), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["verdict"] == "healthy" and doc["run"]["judged"] == 8
    assert doc["run"]["unknown"] == {"not logged": ["rollout_mismatch"]}


def test_knobs_from_flag_and_run_dir_change_the_advice(tmp_path, capsys):
    run = rows(60, **{"actor/entropy": lambda i: 1.0 if i < 20 else 0.2, "actor/clipfrac_upper": 0.02})
    d = tmp_path / "run"
    d.mkdir()
    write(d / "metrics.jsonl", run)
    main([str(d)])
    assert "raise algo.eps_high" in capsys.readouterr().out
    main([str(d), "--knob", "eps_high=0.28"])
    assert "already 0.28" in capsys.readouterr().out
    (d / "config.json").write_text(
        json.dumps({"algo": {"eps_high": 0.3, "dynamic_sampling": True}, "train": {"lr": 1e-6}})
    )
    main([str(d)])
    assert "already 0.3" in capsys.readouterr().out


def test_report_figures_have_titles_panels_and_units(tmp_path, capsys):
    pytest.importorskip("seaborn")
    rep = tmp_path / "rep"
    assert main([str(CAL / "website-sanitizer-qwen0.5b-grpo-truncation.log"), "--report", str(rep)]) == 0
    md = (rep / "report.md").read_text()
    assert "## run: failing" in md and "Truncation noise: failing" in md and "What to do:" in md
    assert "![run](run0.png)" in md and (rep / "run0.png").stat().st_size > 20000
    assert "shared/" not in md  # cites the paper, not a path outside the repository
    # 5-token answers are not drawn against the paper's 1k-4k-token band; a long-CoT run is
    short = rows(40, **{"rollout/length_mean": 5.0, "actor/entropy": 0.6})
    long = rows(40, **{"rollout/length_mean": lambda i: 1000 + 50 * i, "actor/entropy": 0.6})
    write(
        tmp_path / "multi.jsonl",
        [{**r, "arm": "short"} for r in short] + [{**r, "arm": "long"} for r in long],
    )
    main([str(tmp_path / "multi.jsonl"), "--report", str(tmp_path / "r2"), "--max-figures", "1"])
    md = (tmp_path / "r2" / "report.md").read_text()
    assert "Figures for the first 1 of 2 runs (`--max-figures`)" in md
    assert "`rollout/length_mean`: reference band" not in md.split("## arm=long")[0]
    main([str(tmp_path / "multi.jsonl"), "--run-label", "arm=long", "--report", str(tmp_path / "r3")])
    md = (tmp_path / "r3" / "report.md").read_text()
    assert "`rollout/length_mean`: reference band" in md and "arXiv:2503.14476" in md


def test_follow_prints_a_line_when_a_verdict_changes(tmp_path):
    log = tmp_path / "metrics.jsonl"
    lines: list[str] = []
    ticks = {"n": 0}

    def grow(_):
        """The trainer: two more steps per poll, entropy collapsing from step 30; stops at 80."""
        n = ticks["n"]
        if n * 2 < 80:
            with log.open("a") as fh:
                for i in (2 * n, 2 * n + 1):
                    fh.write(
                        json.dumps(
                            {
                                "step": i,
                                "actor/entropy": 1.0 if i < 30 else 0.2,
                                "rollout/truncation_rate": 0.0,
                                "actor/grad_norm": 0.3,
                                "rollout/accuracy": 0.3 + 0.001 * (i % 2),
                            }
                        )
                        + "\n"
                    )
        ticks["n"] += 1

    grow(None)
    follow(str(log), "auto", HealthConfig(), {}, interval=1.0, until_idle=3.0, emit=lines.append, sleep=grow)
    assert any("entropy_collapse unknown -> healthy" in s for s in lines)
    assert any("entropy_collapse" in s and "-> failing" in s for s in lines)
    first = next(s for s in lines if "-> failing" in s)
    assert first.startswith("[step ") and int(first[6:].split("]")[0]) >= 30
    assert len(lines) < 12  # a line per change, not per poll


def test_follow_cli_on_a_run_that_is_still_writing(tmp_path):
    """A real writer process and ``dapo diagnose --follow`` side by side; a partial last line
    and a file that does not exist yet are waited for."""
    log = tmp_path / "metrics.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dapo.cli",
            "diagnose",
            str(log),
            "--follow",
            "--interval",
            "0.2",
            "--until-idle",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def writer():
        time.sleep(0.5)
        with log.open("w") as fh:
            for i in range(60):
                line = json.dumps({"step": i, "rollout/truncation_rate": 0.0 if i < 25 else 1.0})
                fh.write(line[:10])
                fh.flush()
                time.sleep(0.01)
                fh.write(line[10:] + "\n")
                fh.flush()
                time.sleep(0.03)

    t = threading.Thread(target=writer)
    t.start()
    out, err = proc.communicate(timeout=60)
    t.join()
    assert proc.returncode == 0, err
    assert "truncation_noise" in out and "-> failing" in out and "Traceback" not in err
