"""The reward scorer against verl's ``math_dapo`` (the paper's reference scorer) on the committed
corpus (benchmarks/scorer_parity.py): the corpus is what the script generates, the gate holds
(>= 99% agreement on well-formed responses, every disagreement justified), and the committed
report reports/scorer/parity.{json,md} is what the script writes now."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from dapo.rewards import score_integer_answer

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("scorer_parity", ROOT / "benchmarks/scorer_parity.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["scorer_parity"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


parity = _load()


@pytest.fixture(scope="module")
def corpus():
    return parity.load_corpus()


def test_corpus_is_the_generated_one(corpus):
    # no hand edits: regenerate with `python benchmarks/scorer_parity.py --write-corpus`
    assert corpus == parity.build_corpus(), "tests/data/scorer/corpus.jsonl is stale or hand-edited"


def test_corpus_shape(corpus):
    assert len(corpus) >= 200
    assert len({r["id"] for r in corpus}) == len(corpus)
    for r in corpus:
        assert {"id", "text", "truth", "well_formed", "readable", "kind", "stated", "note"} <= set(r)
        assert isinstance(r["truth"], int) and isinstance(r["well_formed"], bool)
        assert not r["well_formed"] or r["readable"]  # well-formed is the narrower label
    assert sum(r["well_formed"] for r in corpus) >= 200
    assert 0.3 < sum(r["stated"] == r["truth"] for r in corpus) / len(corpus) < 0.8


def test_our_scorer_gives_the_graders_verdict(corpus):
    # on every readable row: +1 exactly when the stated integer is the truth; an unreadable row
    # is never rewarded, except a truncated response whose last Answer: line holds the truth
    for r in corpus:
        got = score_integer_answer(r["text"], r["truth"])
        if r["readable"]:
            assert got == (r["stated"] == r["truth"]), r["id"]
        elif got:
            assert r["kind"] == "truncated_after_answer", r["id"]


def test_every_justification_names_a_reason_and_a_row(corpus):
    ids = {r["id"] for r in corpus}
    assert set(parity.JUSTIFIED) <= ids
    assert set(parity.JUSTIFIED.values()) == set(parity.REASONS)
    assert all(right in ("ours", "verl", "both defensible") for right, _ in parity.REASONS.values())


@pytest.fixture(scope="module")
def result(corpus):
    compute_score = parity.verl_compute_score()
    if compute_score is None:
        if os.environ.get("DAPO_REQUIRE_PEERS"):
            pytest.fail(parity.VERL_MISSING)
        pytest.skip("verl not importable (the peers extra; DAPO_REQUIRE_PEERS=1 makes this an error)")
    return parity.compare(corpus, compute_score)


def test_well_formed_agreement(result):
    well = result["counts"]["well_formed"]
    assert well["rows"] >= 200
    assert well["agreement"] >= parity.MIN_WELL_FORMED_AGREEMENT, result["disagreements"]


def test_every_disagreement_is_justified_and_no_justification_is_stale(result):
    assert result["unjustified"] == []
    assert result["stale_justifications"] == []
    assert all(d["justification"] for d in result["disagreements"])
    assert result["gate"]["passed"]


def test_committed_report_is_current(result):
    committed = json.loads((parity.OUT / "parity.json").read_text(encoding="utf-8"))
    fresh = json.loads(json.dumps(result, ensure_ascii=False))
    assert committed == fresh, "reports/scorer is stale: run python benchmarks/scorer_parity.py"
    assert (parity.OUT / "parity.md").read_text(encoding="utf-8") == parity.render_markdown(result)


def test_script_exit_codes(result, tmp_path, monkeypatch, capsys):
    assert parity.main(["--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "parity.json").read_text()) == json.loads(json.dumps(result))
    # a disagreement without justification fails the run
    some = result["disagreements"][0]["id"]
    monkeypatch.setattr(parity, "JUSTIFIED", {k: v for k, v in parity.JUSTIFIED.items() if k != some})
    assert parity.main(["--out", str(tmp_path)]) == 1
    assert some in capsys.readouterr().err
    # a justification for a row that agrees is stale and fails the run too
    agreeing = next(r["id"] for r in parity.load_corpus() if r["kind"] == "bare")
    monkeypatch.setattr(
        parity, "JUSTIFIED", {**parity.JUSTIFIED, some: "verl-period", agreeing: "verl-period"}
    )
    assert parity.main(["--out", str(tmp_path)]) == 1
    assert agreeing in capsys.readouterr().err


def test_missing_verl_is_one_clear_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(parity, "verl_compute_score", lambda: None)
    assert parity.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == parity.VERL_MISSING and "pip install --no-deps verl==0.9.1" in err
    assert not (tmp_path / "parity.json").exists()
