"""``dapo train`` reads the toys' off-policy table (scale/ops/staleness_table.py): a tolerated, a
not-tolerated and an unknown configuration, on a table of known contents and on the committed one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scale.config import load
from scale.ops.staleness_table import TABLE, base_loss, correction_name, lookup

ROOT = Path(__file__).parents[1]


def _row(config, k, lows_highs):
    return {
        "config": config,
        "k": k,
        "accuracy": {
            b: {"mean": (lo + hi) / 2, "low": lo, "high": hi, "n": 30} for b, (lo, hi) in lows_highs.items()
        },
    }


def table(tmp_path: Path) -> Path:
    """dapo+token_tis: within the margin at every k; dapo+none: a loss on both blocks from k = 2;
    dapo+seq_tis: the blocks disagree at k = 4."""
    ok = {"discovery": (-0.01, 0.02), "confirmation": (-0.015, 0.01)}
    grid = [_row("dapo, token_tis", k, ok) for k in (1, 2, 4, 8)]
    grid += [_row("dapo, none", 1, ok)] + [
        _row("dapo, none", k, {"discovery": (-0.09, -0.03), "confirmation": (-0.08, -0.02)})
        for k in (2, 4, 8)
    ]
    grid += [_row("dapo, seq_tis", k, ok) for k in (1, 2)] + [
        _row("dapo, seq_tis", k, {"discovery": (-0.05, 0.01), "confirmation": (-0.015, 0.02)}) for k in (4, 8)
    ]
    path = tmp_path / "off_policy.json"
    path.write_text(
        json.dumps({"margin": 0.02, "blocks": ["discovery", "confirmation"], "grid": grid, "tolerated": {}})
    )
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
        (("rollout.max_staleness=16", "rollout.correction=token_tis"), "cannot tell", 16),
        (("rollout.max_staleness=2", "rollout.correction=token_tis", "algo.eps_high=0.25"), "cannot tell", 2),
    ],
)
def test_the_lookup_says_tolerated_not_tolerated_or_cannot_tell(tmp_path, overrides, status, col):
    found = lookup(cfg(*overrides), table(tmp_path))
    assert found is not None and found.status == status and found.k == col, found
    if status == "cannot tell":
        assert "dapo toy check" in found.message


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


@pytest.mark.parametrize(
    "overrides,status",
    [
        (("rollout.max_staleness=8", "rollout.correction=k3_rs"), "tolerated"),
        (("rollout.max_staleness=4", "rollout.correction=bypass"), "not tolerated"),
        (("rollout.max_staleness=2", "rollout.correction=token_tis"), "cannot tell"),
    ],
)
def test_the_committed_table_says_what_the_readme_says(overrides, status):
    """docs/how-to/disaggregated.md quotes these three verdicts of the committed table."""
    found = lookup(cfg(*overrides))
    assert found is not None and found.status == status, found
