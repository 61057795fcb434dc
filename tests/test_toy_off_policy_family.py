"""The off_policy experiment family: the pipeline clock, and
the report end to end on a short horizon."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dapo.cli import main as dapo_main
from dapo.offpolicy import CORRECTIONS, correction_fields
from toybench import off_policy as O
from toybench.engine import train_many

times = st.lists(st.floats(0.0, 100.0), min_size=1, max_size=30)


@given(times, st.floats(0.0, 50.0))
def test_synchronous_pipeline_is_generate_then_train(gen, train):
    t = O.pipeline_time(gen, train, 0)
    total = 0.0
    for g, got in zip(gen, t):
        total += g + train
        assert got == pytest.approx(total)


@given(times, st.floats(0.0, 50.0), st.integers(0, 8))
def test_more_staleness_is_never_slower_and_bounded_by_the_slower_side(gen, train, k):
    a, b = O.pipeline_time(gen, train, k), O.pipeline_time(gen, train, k + 1)
    assert all(x >= y - 1e-9 for x, y in zip(a, b))
    assert all(x <= y + 1e-9 for x, y in itertools.pairwise(a))  # finish times never decrease
    # the pipeline can never beat either side working alone
    assert a[-1] >= max(sum(gen), train * len(gen)) - 1e-9


def test_every_correction_at_k0_is_the_same_run():
    """The grid keeps one k = 0 arm per base because a correction cannot act when the engine
    is the trainer."""
    exp = O.grid_experiment(steps=12, staleness=(0, 1))
    base = exp.spec("dapo_k0", 0)
    specs = [base] + [
        dataclasses.replace(base, cfg=base.cfg.replace(**correction_fields(c))) for c in CORRECTIONS
    ]
    logs = train_many(specs)
    for log in logs[1:]:
        assert [m["toy/expected_accuracy"] for m in log] == [m["toy/expected_accuracy"] for m in logs[0]]


def test_the_family_runs_and_reports_both_blocks(tmp_path):
    out = tmp_path / "op"
    args = ["toy", "off-policy", "--seeds", "2", "--steps", "12", "--jobs", "1", "--quiet", "--out", str(out)]
    assert dapo_main(args) == 0
    text = (out / "README.md").read_text()
    for section in ("Tolerated staleness", "Engine precision", "keep protecting", "The clock", "other way"):
        assert section in text
    data = json.loads((out / "off_policy.json").read_text())
    assert set(data["blocks"]) == {"discovery", "confirmation"}
    assert set(data["verdicts"]) == {c.label for c in O.configs()}
    for label, v in data["verdicts"].items():
        assert v["upto"] in O.STALENESS and (v["harmful_from"] is None or v["harmful_from"] in O.STALENESS)
        per = data["differences"][label]  # per seed, both blocks: the verdict can be recomputed
        assert set(per) == {"accuracy", "entropy"}
        assert all(len(per["accuracy"]["1"][b]) == 2 for b in ("discovery", "confirmation"))
    assert set(data["protection"]) == {"entropy_collapse", "zero_gradient", "length_bias", "truncation_noise"}
    sync = [r for r in data["clock"] if r["arm"] == "dapo_k0"]
    assert len(sync) == 1 and all(v == pytest.approx(1.0) for v in sync[0]["speedup"].values())
    stale = [r for r in data["clock"] if r["k"] == 8 and not r["partial"]]
    assert all(v >= 1.0 for r in stale for v in r["speedup"].values())
