"""`dapo toy suite` (what `nox -s toy` runs): the main job's families in one pass, each family's
files as its own command writes them, and a run two experiments share trained once and given
to both."""

import json

import pytest
from test_toy_engine import assert_logs_match

from dapo.cli import main as dapo_main
from toybench.experiment import run_experiments, with_steps
from toybench.experiments import REGISTRY
from toybench.off_policy import protection_experiments
from toybench.suite import interval_text

pytestmark = pytest.mark.slow


def _contrasts(path):
    data = json.loads(path.read_text())
    return {
        name: [(c["name"], c["verdict"], c["blocks"]) for c in e["contrasts"]]
        for name, e in data["experiments"].items()
    }


def test_the_suite_writes_every_familys_files_and_equals_the_separate_commands(tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["toy", "suite", "--seeds", "2", "--steps", "12", "--jobs", "2", "--quiet", "--no-plots"]
    assert dapo_main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("toy", "prompt_selection"):
        assert (out / name / "summary.json").is_file()
    for name in ("entropy_collapse", "zero_gradient", "length_bias", "truncation_noise"):
        assert (out / "toy" / name / "metrics.jsonl").is_file()
    assert (out / "ladder" / "README.md").is_file() and (out / "ladder" / "ladder.json").is_file()
    # the off-policy family is its own job (its table needs 45 + 45 seeds), and the suite says so
    assert not (out / "off_policy").exists()
    # the closing lines: the four verdicts, where each report is, and where the off-policy family is
    tail = printed[printed.index("== the four failure modes") :]
    assert all(name in tail for name in REGISTRY) and "== reports" in tail
    assert "nox -s off_policy" in tail
    # each failure mode's effect on each block, the numbers summary.json (and the README) hold
    summary = json.loads((out / "toy" / "summary.json").read_text())["experiments"]
    for name in REGISTRY:
        (primary,) = [c for c in summary[name]["contrasts"] if c["role"] == "primary"]
        cells = [primary["blocks"][b] for b in ("discovery", "confirmation")]
        said = " / ".join(interval_text(c["mean_diff"], *c["ci95"]) for c in cells)
        assert said in tail and primary["name"] in tail, (name, said)
    # then the check of the config's loss (none given: DAPO's, at DAPO's knobs), for the gate
    (checked,) = json.loads((out / "toy" / "check.json").read_text())["results"]
    assert checked["loss"] == "dapo" and checked["knobs"]["eps_high"] == 0.28
    assert "== the config's policy loss: dapo " in printed
    # the gate's summary is what `dapo toy run all` writes for the same seeds and horizon
    alone = tmp_path / "alone"
    assert dapo_main(["toy", "run", "all", "--seeds", "2", "--steps", "12", "--jobs", "2", "--quiet",
                      "--no-plots", "--brief", "--out", str(alone)]) == 0  # fmt: skip
    assert _contrasts(out / "toy" / "summary.json") == _contrasts(alone / "summary.json")


def test_a_run_two_experiments_share_is_trained_once_and_given_to_both():
    """The off-policy protection's k = 0 arms are the failure mode's own arms: one training,
    the same log in both results, equal to the experiment run on its own (the trajectory bit
    for bit; reductions over a run's tokens to the last bits, which depend on batch-mates)."""
    exp = with_steps(REGISTRY["length_bias"], 6)
    (prot,) = [with_steps(e, 6) for e in protection_experiments(staleness=(0, 1)) if "length" in e.name]
    stats: dict[str, int] = {}
    both = run_experiments([exp, prot], seeds=[0, 1], jobs=1, progress=False, stats=stats)
    shared = len(exp.arms) * 2  # each arm of the experiment, on both seeds, is prot's k = 0 arm
    assert stats["run_ids"] == (len(exp.arms) + len(prot.arms)) * 2
    assert stats["runs"] == stats["run_ids"] - shared
    (alone,) = run_experiments([exp], seeds=[0, 1], jobs=1, progress=False)
    for arm in exp.arms:
        for seed in (0, 1):
            assert_logs_match(alone.logs[arm][seed], both[0].logs[arm][seed], (arm, seed))
            assert both[1].logs[f"{arm}_k0"][seed] is both[0].logs[arm][seed]
