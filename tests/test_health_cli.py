"""``dapo diagnose``: exit statuses, the report and its figures, knobs, and --follow."""

import json
import math
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
    assert "inconclusive (12 of 13 rules could not judge: 12 not logged)" in capsys.readouterr().out
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
    assert doc["run"]["verdict"] == "healthy" and doc["run"]["judged"] == 9
    assert doc["run"]["unknown"] == {
        "not logged": ["validation", "rollout_mismatch", "off_policy_drift", "loss_spikes"]
    }


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
    # the run's loss, named in the text, the JSON and the report (read from config.json)
    (d / "config.json").write_text(json.dumps({"algo": {"policy_loss": "mypkg.losses:my_loss"}}))
    main([str(d)])
    assert "policy loss: mypkg.losses:my_loss" in capsys.readouterr().out.splitlines()[:3]
    main([str(d), "--json"])
    assert json.loads(capsys.readouterr().out)["run"]["policy_loss"] == "mypkg.losses:my_loss"
    main([str(d), "--report", str(tmp_path / "rep")])
    assert "Policy loss: `mypkg.losses:my_loss`." in (tmp_path / "rep" / "report.md").read_text()
    main([str(d), "--knob", "policy_loss=verl:gspo"])  # a log without config.json: said by hand
    assert "policy loss: verl:gspo" in capsys.readouterr().out


def test_report_figures_have_titles_panels_and_units(tmp_path, capsys):
    pytest.importorskip("seaborn")
    rep = tmp_path / "rep"
    assert main([str(CAL / "website-sanitizer-qwen0.5b-grpo-truncation.log"), "--report", str(rep)]) == 0
    md = (rep / "report.md").read_text()
    name = "website-sanitizer-qwen0.5b-grpo-truncation"  # the run is named after its file
    assert f"## {name}: failing" in md and "Truncation noise: failing" in md and "What to do:" in md
    assert f"![{name}]({name}.png)" in md and (rep / f"{name}.png").stat().st_size > 20000
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
    run_dir = tmp_path / "qwen-32b"
    run_dir.mkdir()
    write(run_dir / "metrics.jsonl", long)
    main([str(run_dir), "--report", str(tmp_path / "r4")])
    assert (tmp_path / "r4" / "qwen-32b.png").is_file()  # a run directory: named after it


def test_bands_are_drawn_only_on_the_runs_scale():
    """The paper's Figure-7 bands squashed runs far off their scale: a -0.6..0.2 reward band
    against a run at 0.65-0.94, an entropy band at 0.55-0.8 against 0.05-0.47."""
    from dapo.health import PAPER_REFERENCES as P

    assert not P["rollout/reward_mean"].comparable([0.65 + 0.29 * i / 99 for i in range(100)])
    assert not P["actor/entropy"].comparable([0.47 - 0.42 * i / 99 for i in range(100)])
    assert P["rollout/reward_mean"].comparable([-0.6 + 0.8 * i / 99 for i in range(100)])
    assert P["actor/entropy"].comparable([0.62 + 0.1 * i / 99 for i in range(100)])
    assert P["rollout/length_mean"].comparable([900 + 30 * i for i in range(100)])
    assert not P["rollout/length_mean"].comparable([4.0, 6.0])


def test_figure_legends_sit_outside_the_data_and_missing_values_are_gaps(tmp_path):
    pytest.importorskip("seaborn")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dapo.health import diagnose
    from dapo.health.report import _drawn, plots

    run = rows(
        60, **{"actor/entropy": lambda i: 1.0 - 0.01 * i, "actor/grad_norm": 0.3, "rollout/accuracy": 0.5}
    )
    for r in run[20:25]:
        del r["actor/grad_norm"]  # steps that trained nothing: no grad norm
    for r in run:
        if r["step"] % 10:
            continue
        r["eval/score"] = 0.4
    xs, ys, dense = _drawn(run, "actor/grad_norm")
    assert dense and len(xs) == 60 and all(math.isnan(y) for y in ys[20:25])
    assert not _drawn(run, "eval/score")[2]  # a sparse series: markers, no gaps
    captured = {}
    real_savefig = plt.Figure.savefig

    def keep(fig, *a, **k):
        captured["fig"] = fig
        return real_savefig(fig, *a, **k)

    plt.Figure.savefig = keep
    try:
        plots(tmp_path, "x.jsonl", {"run": run}, {"run": diagnose(run)}, {"run": "healthy"}, {}, 1)
    finally:
        plt.Figure.savefig = real_savefig
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = captured["fig"]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) >= 4
    for ax in panels:
        legend = ax.get_legend().get_window_extent(renderer)
        for other in panels:  # over no panel's plotting area, its own included
            data = other.get_window_extent(renderer)
            assert not (
                legend.x0 < data.x1 and data.x0 < legend.x1 and legend.y0 < data.y1 and data.y0 < legend.y1
            ), (
                ax.get_title(),
                other.get_title(),
            )


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
    first = next(s for s in lines if "entropy_collapse" in s and "-> failing" in s)
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
    assert "truncation_noise" in out and "-> warning" in out and "Traceback" not in err


def test_follow_on_a_path_that_never_appears_says_so_and_fails(tmp_path):
    """``--follow`` on a typo: one line saying it waits, then a nonzero exit at --until-idle."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo.cli",
            "diagnose",
            str(tmp_path / "runs" / "typo"),
            "--follow",
            "--interval",
            "0.2",
            "--until-idle",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "waiting for" in r.stdout and "no such file or directory" in r.stdout
    assert "still no log after waiting" in r.stderr


def test_a_closed_pipe_ends_diagnose_quietly(tmp_path):
    """`dapo diagnose LOG | head`: the reader closing the pipe is no internal error."""
    many = [{**r, "arm": f"a{k}"} for k in range(300) for r in rows(30, **{"actor/entropy": 0.6})]
    log = write(tmp_path / "many.jsonl", many)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo.cli", "diagnose", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141) and "internal error" not in err, err
    assert not (tmp_path / "runs").exists()  # no crash log written


def test_run_label_selects_by_its_parts_as_against_does(tmp_path, capsys):
    """A toy metrics file labels its runs ``experiment=x/arm=a/seed=s``: ``--run-label`` takes
    any of those parts (one run, or every seed of an arm); one that matches nothing is one line
    naming the option, exit 2."""
    runs = [
        {**r, "experiment": "entropy_collapse", "arm": arm, "seed": seed}
        for arm in ("symmetric", "clip_higher")
        for seed in (0, 1)
        for r in rows(40, **{"actor/entropy": 0.6})
    ]
    write(tmp_path / "metrics.jsonl", runs)
    capsys.readouterr()
    assert main([str(tmp_path / "metrics.jsonl"), "--run-label", "arm=symmetric/seed=1"]) == 0
    heads = [x for x in capsys.readouterr().out.splitlines() if x.startswith("== ")]
    assert len(heads) == 1 and "experiment=entropy_collapse/arm=symmetric/seed=1:" in heads[0]
    assert main([str(tmp_path / "metrics.jsonl"), "--run-label", "arm=clip_higher"]) == 0
    heads = [x for x in capsys.readouterr().out.splitlines() if x.startswith("== ")]
    assert len(heads) == 2 and all("arm=clip_higher" in x for x in heads)
    assert main([str(tmp_path / "metrics.jsonl"), "--run-label", "arm=nope"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("note: ")]
    assert len(err) == 1 and err[0].startswith("dapo diagnose: --run-label 'arm=nope' matches no run")
