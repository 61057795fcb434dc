"""``dapo train`` reads the toys' off-policy table (scale/ops/staleness_table.py): a tolerated, a
not-tolerated and an unknown configuration, on a table of known contents and on the committed one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scale.config import load
from scale.ops.staleness_table import TABLE, Movement, base_loss, correction_name, lookup

ROOT = Path(__file__).parents[1]


TOY_KL = {1: 2.5e-3, 2: 5e-3, 4: 1e-2, 8: 2e-2}
"""The toys' k3 KL per k of every row in the synthetic table (the committed one's order of size)."""


def table(tmp_path: Path) -> Path:
    """dapo+token_tis: tolerated up to k = 8; dapo+none: up to 1, harmful from 2; dapo+seq_tis: up
    to 2, then cannot tell."""
    verdicts = {
        "dapo, token_tis": {"upto": 8, "stop": None, "harmful_from": None, "why": ""},
        "dapo, none": {"upto": 1, "stop": 2, "harmful_from": 2, "why": "at k = 2 not shown: accuracy ..."},
        "dapo, seq_tis": {
            "upto": 2,
            "stop": 4,
            "harmful_from": None,
            "why": "at k = 4 not shown: entropy ...",
        },
        "dapo +partial, token_tis": {"upto": 2, "stop": 4, "harmful_from": 8, "why": "..."},
    }
    grid = [{"config": row, "k": k, "k3_kl": kl} for row in verdicts for k, kl in TOY_KL.items()]
    path = tmp_path / "off_policy.json"
    path.write_text(json.dumps({"verdicts": verdicts, "grid": grid}))
    return path


def cfg(*overrides):
    return load("tiny-cpu", ["rollout.mode=disaggregated", "eval.every=0", *overrides])


@pytest.mark.parametrize(
    "overrides,status,col",
    [
        (("rollout.max_staleness=3", "rollout.correction=token_tis"), "tolerated", 4),
        (("rollout.max_staleness=2", "rollout.correction=none"), "not tolerated", 2),
        (("rollout.max_staleness=1", "rollout.correction=none"), "tolerated", 1),
        (("rollout.max_staleness=4", "rollout.correction=seq_tis"), "cannot tell", 4),
        (("rollout.max_staleness=2", "rollout.correction=seq_tis"), "tolerated", 2),
        (
            ("rollout.max_staleness=5", "rollout.correction=token_tis", "rollout.partial=true"),
            "not tolerated",
            8,
        ),
        (("rollout.max_staleness=16", "rollout.correction=token_tis"), "cannot tell", 16),
        (("rollout.max_staleness=2", "rollout.correction=token_tis", "algo.eps_high=0.25"), "cannot tell", 2),
    ],
)
def test_the_lookup_says_tolerated_not_tolerated_or_cannot_tell(tmp_path, overrides, status, col):
    found = lookup(cfg(*overrides), table(tmp_path))
    assert found is not None and found.status == status and found.k == col, found
    if status == "cannot tell":
        assert "dapo toy check" in found.message


def test_the_run_is_placed_by_how_far_its_policy_moves(tmp_path):
    """An LLM-like run at max_staleness 8 that moves less than the toy at k = 1 is read at k = 1;
    a jump in movement moves it along the row, said once per change; beyond the row: cannot tell."""
    move = Movement(cfg("rollout.max_staleness=8", "rollout.correction=none"), table(tmp_path))
    assert move.row == "dapo, none"
    said = move.observe({"mismatch/k3_kl": 1e-5})
    assert "1.00e-05 per token over 1 step(s)" in said and "at k = 1 (2.50e-03)" in said
    assert "the toys tolerate it" in said
    assert move.observe({"mismatch/k3_kl": 1e-5}) is None  # the same place: nothing new
    assert move.observe({"mismatch/k3_kl": float("nan")}) is None  # a step without the metric
    said = move.observe({"mismatch/k3_kl": 1.1e-2})  # mean 3.7e-3: between k = 1 and 2
    assert "at k = 2" in said and "do NOT tolerate" in said
    said = move.observe({"mismatch/k3_kl": 1.0})
    assert "beyond the toys' row 'dapo, none'" in said and "cannot tell" in said
    assert Movement(cfg(), table(tmp_path)).observe({"mismatch/k3_kl": 1.0}) is None  # k = 0: no placement
    unknown = Movement(cfg("rollout.max_staleness=2", "rollout.correction=k3_rs"), table(tmp_path))
    assert unknown.observe({"mismatch/k3_kl": 1e-3}) is None  # no row for it: the start's line said so


def test_the_trainers_reading_of_a_verdict_is_the_procedures():
    """scale reads the JSON without importing toybench: the same three words at every column."""
    from scale.ops.staleness_table import status_at
    from toybench.noninferiority import Verdict

    for upto in (0, 1, 2, 4, 8):
        for harm in (None, 1, 2, 4, 8):
            if harm is not None and harm <= upto:
                continue
            v = Verdict(upto, None, harm, "")
            for col in (1, 2, 4, 8):
                assert status_at({"upto": upto, "harmful_from": harm}, col) == v.at(col)


def test_staleness_zero_says_nothing_and_a_missing_table_cannot_tell(tmp_path):
    assert lookup(cfg(), table(tmp_path)) is None
    found = lookup(cfg("rollout.max_staleness=2"), tmp_path / "none.json")
    assert found.status == "cannot tell" and "no staleness table" in found.message


def test_the_base_loss_and_the_correction_are_recognised():
    from dapo.config import PRESETS
    from dapo.offpolicy import correction_fields

    assert base_loss(PRESETS["dapo"]) == "dapo" and base_loss(PRESETS["grpo"]) == "grpo"
    assert base_loss(PRESETS["clip_higher"]) is None  # a rung between them is neither
    assert correction_name(PRESETS["dapo"].replace(**correction_fields("icepop"))) == "icepop"
    assert correction_name(PRESETS["dapo"].replace(tis_cap=3.0)) is None


def test_validate_only_prints_the_committed_tables_word(tmp_path):
    """The committed table is read by `dapo train --validate-only`: one line naming the row."""
    assert TABLE.is_file()
    from scale.ops.tiny import build_tiny_data

    train, evals = build_tiny_data(tmp_path / "data")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo.cli",
            "train",
            "--config",
            "tiny-cpu",
            "--validate-only",
            f"data.train={train}",
            f"data.eval={evals}",
            f"output.dir={tmp_path / 'run'}",
            "rollout.mode=disaggregated",
            "eval.every=0",
            "rollout.max_staleness=2",
            "rollout.correction=token_tis",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    line = [x for x in proc.stderr.splitlines() if "rollout.max_staleness=2" in x]
    assert len(line) == 1 and "row 'dapo, token_tis'" in line[0], proc.stderr


def test_a_staleness_the_table_shows_harmful_is_refused_unless_forced(tmp_path):
    """`dapo train` (here --validate-only: nothing built) exits 5 naming the row and the harm;
    --force starts with a loud line (and the run's gate.json records it)."""
    import os

    from scale.ops.tiny import build_tiny_data

    train, evals = build_tiny_data(tmp_path / "data")
    argv = [
        sys.executable, "-m", "dapo.cli", "train", "--config", "tiny-cpu", "--validate-only",
        f"data.train={train}", f"data.eval={evals}", f"output.dir={tmp_path / 'run'}",
        "rollout.mode=disaggregated", "eval.every=0", "rollout.max_staleness=2", "rollout.correction=none",
    ]  # fmt: skip
    env = {**os.environ, "DAPO_STALENESS_TABLE": str(table(tmp_path))}
    refused = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
    assert refused.returncode == 5, refused.stderr
    assert "do NOT tolerate" in refused.stderr and "row 'dapo, none'" in refused.stderr
    assert "refusing to start" in refused.stderr and "Traceback" not in refused.stderr
    forced = subprocess.run([*argv, "--force"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert forced.returncode == 0 and "STALENESS THE TOYS SHOW HARMFUL (--force)" in forced.stderr, (
        forced.stderr
    )


@pytest.mark.parametrize(
    "overrides,status",
    [
        (("rollout.max_staleness=8", "rollout.correction=token_tis"), "tolerated"),
        (("rollout.max_staleness=8", "rollout.correction=k3_rs"), "not tolerated"),
        (("rollout.max_staleness=2", "rollout.correction=k3_rs"), "tolerated"),
        (("rollout.max_staleness=4", "rollout.correction=bypass"), "cannot tell"),
        (("rollout.max_staleness=8", "rollout.correction=bypass"), "not tolerated"),
        (("rollout.max_staleness=2", "rollout.correction=seq_tis"), "cannot tell"),
    ],
)
def test_the_committed_table_says_what_the_readme_says(overrides, status):
    """docs/how-to/disaggregated.md quotes these verdicts of the committed table."""
    found = lookup(cfg(*overrides))
    assert found is not None and found.status == status, found
