"""Calibration on real public logs: each log gets the verdict it is held to, every difference
from its authors' verdict is explained, and the committed confusion table is current."""

import json
from pathlib import Path

from dapo.health.calibration import calibrate, criterion, criterion_lines
from dapo.health.verdict import VERDICTS

ROOT = Path(__file__).parents[1]
DATA = ROOT / "tests" / "data" / "health" / "calibration"
SOURCES = json.loads((DATA / "SOURCES.json").read_text())
RULES = {
    "truncation": "truncation_noise",
    **{r.name: r.name for r in __import__("dapo.health.rules", fromlist=["RULES"]).RULES},
}
"""The problem an author named -> the rule that must flag it when both call the run failing."""


def test_sources_carry_provenance_and_the_set_spans_verdicts():
    for src in SOURCES:
        assert (DATA / src["file"]).is_file()
        assert src["url"].startswith("https://github.com/") and src["repository"] and src["where"]
        assert src["authors_words"] and src["steps"] >= 2
        assert src["authors_verdict"] in ("healthy", "warning", "failing", None)
        assert src["batch"] == "development" or src["batch"].startswith("held-out-")
        if src["batch"] != "development":  # what the tool said before anything changed for it
            fp = src["first_pass"]
            verdict = fp["verdict"] if isinstance(fp, dict) else fp
            assert verdict in (*VERDICTS, "unreadable")
            if isinstance(fp, dict):  # recorded with the rules it flagged (issue 48 on)
                assert all(f.split(":")[0] in RULES for f in fp["flagged"])
    judged = [s for s in SOURCES if s["authors_verdict"]]
    assert len(SOURCES) >= 25 and len(judged) >= 20
    assert (
        sum(s["authors_verdict"] == "failing" for s in SOURCES) >= 8
    )  # failed runs, in their authors' words
    assert len({s["repository"] for s in SOURCES}) >= 10
    frameworks = {s["framework"].split()[0].lower().strip("(,") for s in SOURCES}
    assert len(frameworks & {"verl", "trl", "custom", "deepspeed-chat", "unsloth"}) >= 4, frameworks


def test_the_figures_over_every_held_out_batch():
    """Figures, not per-log pins (issue 70): over the 64 logs of held-out-1 to -7, judged now,
    at most 1 run its authors call healthy is called failing (4%; the criterion allows 10%),
    every log is read as published, and at most 4 runs their authors call failing or warning
    are called healthy (measured at issue 70, each explained in
    docs/results/diagnose-calibration.md). Development logs: at most one false alarm of 13."""
    rows = calibrate(DATA)
    held = [r for r in rows if r["batch"].startswith("held-out-")]
    now = criterion(held)
    assert (
        int(now["false alarms"].split("/")[0]) <= 1 and now["readable"] == f"{len(held)}/{len(held)} (100%)"
    )
    assert int(now["misses"]) <= 4, now
    dev = criterion([r for r in rows if r["batch"] == "development"])
    assert int(dev["false alarms"].split("/")[0]) <= 1, dev


def test_committed_calibration_report_is_current():
    committed = json.loads((ROOT / "reports" / "health" / "calibration.json").read_text())
    fresh = calibrate(DATA)
    assert [(r["file"], r["ours"]["verdict"], r["ours"]["flagged"]) for r in committed] == [
        (r["file"], r["ours"]["verdict"], r["ours"]["flagged"]) for r in fresh
    ], "rerun: python -m dapo.health.calibration"


def _row(authors, ours, flagged=(), problem=None, first=None, batch="held-out-9"):
    return {
        "authors_verdict": authors,
        "problem": problem,
        "batch": batch,
        "ours": {"verdict": ours, "flagged": list(flagged)},
        **({"first_pass": first} if first is not None else {}),
    }


def test_the_criterion_counts_what_each_figure_names():
    """Issue 48's five figures on a made-up batch whose answers are known."""
    rows = [
        _row(
            "failing",
            "failing",
            ["not_learning:failing"],
            "not_learning",
            {"verdict": "healthy", "flagged": []},
        ),
        _row(
            "failing",
            "warning",
            ["kl_blowup:warning"],
            "not_learning",
            {"verdict": "warning", "flagged": ["kl_blowup:warning"]},
        ),
        _row(
            "warning",
            "warning",
            ["truncation_noise:warning"],
            "truncation",
            {"verdict": "warning", "flagged": ["truncation_noise:warning"]},
        ),
        _row(
            "failing",
            "failing",
            ["gradients:failing"],
            "other: a crash",
            {"verdict": "unreadable", "flagged": []},
        ),
        _row(
            "healthy",
            "failing",
            ["loss_spikes:failing"],
            None,
            {"verdict": "failing", "flagged": ["loss_spikes:failing"]},
        ),
        _row("healthy", "healthy", [], None, {"verdict": "inconclusive", "flagged": []}),
        _row("healthy", "inconclusive", [], None, {"verdict": "healthy", "flagged": []}),
        _row(None, "failing", ["not_learning:failing"], None, {"verdict": "failing", "flagged": []}),
    ]
    now = criterion(rows)
    assert now["misses"] == "0"
    assert now["flagged"] == "4/4 (100%)"
    assert now["same kind"] == "2/3 (67%)"  # 'other: ...' has no rule; not_learning named once of twice
    assert now["false alarms"] == "1/3 (33%)"
    assert now["inconclusive"] == "1/7 (14%)"
    assert now["readable"] == "8/8 (100%)"
    first = criterion(rows, first_pass=True)
    assert first["misses"] == "1" and first["flagged"] == "2/4 (50%)"
    assert first["same kind"] == "1/3 (33%)" and first["readable"] == "7/8 (88%)"
    old = [dict(r, first_pass=r["first_pass"]["verdict"]) for r in rows]  # verdicts only, as before issue 48
    assert criterion(old, first_pass=True)["same kind"] == "not recorded (3 runs)"
    lines = criterion_lines(rows)
    assert any(line.startswith("| held-out-9 | first |") for line in lines)
    assert any(line.startswith("| held-out-9 | now |") for line in lines)
