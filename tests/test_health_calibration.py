"""Calibration on real public logs: each log gets the verdict it is held to, every difference
from its authors' verdict is explained, and the committed confusion table is current."""

import json
from pathlib import Path

import pytest

from dapo.health.calibration import calibrate, confusion, diagnose_log

ROOT = Path(__file__).parents[1]
DATA = ROOT / "tests" / "data" / "health" / "calibration"
SOURCES = json.loads((DATA / "SOURCES.json").read_text())


@pytest.mark.parametrize("src", SOURCES, ids=[s["file"] for s in SOURCES])
def test_each_calibration_log_gets_its_expected_verdict(src):
    ours = diagnose_log(DATA / src["file"])
    assert ours["verdict"] == src["expected"], ours["headline"]
    if src["authors_verdict"] == "failing":
        rule = {"truncation": "truncation_noise"}.get(src["problem"], src["problem"])
        assert any(flag.startswith(rule + ":") for flag in ours["flagged"]), ours["flagged"]
    if ours["verdict"] != src["authors_verdict"]:
        assert src["why"], "every difference from the authors' verdict is explained"


def test_sources_carry_provenance_and_the_set_spans_verdicts():
    for src in SOURCES:
        assert (DATA / src["file"]).is_file()
        assert src["url"].startswith("https://github.com/") and src["repository"] and src["where"]
        assert src["authors_words"] and src["steps"] >= 8
        assert src["authors_verdict"] in ("healthy", "warning", "failing", None)
    judged = [s for s in SOURCES if s["authors_verdict"]]
    assert len(judged) >= 10 and {"healthy", "failing"} <= {s["authors_verdict"] for s in judged}
    assert len({s["repository"] for s in SOURCES}) >= 8


def test_no_run_its_authors_call_failing_is_called_healthy():
    rows = calibrate(DATA)
    table = confusion(rows)
    assert table.get("failing", {}).get("healthy", 0) == 0
    assert table.get("warning", {}).get("healthy", 0) == 0


def test_committed_calibration_report_is_current():
    committed = json.loads((ROOT / "reports" / "health" / "calibration.json").read_text())
    fresh = calibrate(DATA)
    assert [(r["file"], r["ours"]["verdict"], r["ours"]["flagged"]) for r in committed] == [
        (r["file"], r["ours"]["verdict"], r["ours"]["flagged"]) for r in fresh
    ], "rerun: python -m dapo.health.calibration"
