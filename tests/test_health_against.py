"""``dapo diagnose RUN --against REF``: the test, departures, the outcome, the stated false-alarm
rate, its invariances (level offsets, units, thinning, relabelled steps), alignment by share,
one reference, and bad input (dapo.health.against)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.health.against import (
    AgainstConfig,
    Reference,
    compare,
    compare_all,
    load_references,
    t_quantile,
)
from dapo.health.cli import EXIT_FAIL, EXIT_USAGE, main

ROOT = Path(__file__).parents[1]


def process(seed, n=80, onset=None, entropy_shift=0.0, accuracy_shift=0.0, between=1.0, length=None):
    """A run of one recipe: accuracy rising, entropy falling, grad norm and KL flat; each run its
    own rate and level (``between`` scales that), and noise at every step. From ``onset`` on,
    entropy and accuracy are shifted. ``length``: the run's curves stretched over that many
    steps (the same recipe run longer)."""
    rng = np.random.default_rng(seed)
    length = length or n
    rate = 1.0 + between * 0.15 * rng.normal()
    level = between * 0.03 * rng.normal()
    rows = []
    for t in range(n):
        p = t / (length - 1)
        acc = 0.15 + 0.45 * (1 - np.exp(-3 * p * rate)) + level + 0.03 * rng.normal()
        ent = 1.2 - 0.3 * p * rate - level + 0.015 * rng.normal()
        if onset is not None and t >= onset:
            acc += accuracy_shift
            ent += entropy_shift
        rows.append(
            {
                "step": t,
                "rollout/accuracy": float(acc),
                "actor/entropy": float(ent),
                "actor/grad_norm": float(0.5 + 0.05 * rng.normal()),
                "actor/approx_kl": float(abs(0.001 + 0.0003 * rng.normal())),
            }
        )
    return rows


def refs(seeds, **kw):
    return [Reference(f"ref{s}", Path(f"ref{s}"), "run", process(s, **kw)) for s in seeds]


REFS = refs(range(4))


def test_departure_found_near_its_step_with_direction_and_outcome_not_following():
    for seed in range(100, 110):
        c = compare("run", process(seed, onset=50, entropy_shift=-0.3), REFS)
        d = c.metrics["actor/entropy"].departure
        assert d is not None and d.direction == "below", seed
        assert abs(d.step - 50) <= 3, (seed, d.step)
        assert d.confirmed >= d.step and d.ratio and 0.6 < d.change < 0.9  # entropy ~1.0 -> ~0.75: a factor
        assert d.z < -d.threshold and d.threshold > 2
        assert d.followed_by is None
        acc = c.metrics["rollout/accuracy"].departure
        assert acc is None or acc.direction == "above"  # seed 10x's own faster course: never below
        assert c.status == "warning"
        f = c.finding()
        assert f.rule == "against" and f.status == "warning" and f.start_step == d.step
        assert "actor/entropy below from step" in f.evidence and "the outcome did not follow" in f.evidence
        assert "false-alarm rate 0.05 over 4 metric(s)" in f.evidence


def test_upward_departure_is_above():
    c = compare("run", process(100, onset=40, entropy_shift=+0.3), REFS)
    d = c.metrics["actor/entropy"].departure
    assert d is not None and d.direction == "above" and 40 <= d.step <= 43 and d.change > 1


def test_outcome_following_a_health_metric_makes_it_failing_when_it_stays_below():
    c = compare("run", process(101, onset=40, entropy_shift=-0.3, accuracy_shift=-0.25), REFS)
    ent, acc = c.metrics["actor/entropy"].departure, c.metrics["rollout/accuracy"].departure
    assert ent is not None and acc is not None and acc.direction == "below" and not acc.ratio
    assert -0.3 < acc.change < -0.2  # accuracy: a difference in its own units
    assert ent.followed_by == "rollout/accuracy" and ent.followed_at == acc.step >= ent.step
    assert acc.stays_below and acc.tail_z <= -acc.tail_threshold
    assert c.status == "failing" and "failing: rollout/accuracy" in c.finding().evidence


def test_an_outcome_that_fell_and_came_back_is_a_warning():
    rows = process(104)
    for r in rows:
        if 30 <= r["step"] < 45:
            r["rollout/accuracy"] -= 0.25
    c = compare("run", rows, REFS)
    d = c.metrics["rollout/accuracy"].departure
    assert d is not None and d.direction == "below" and 27 <= d.step <= 33
    assert not d.stays_below and c.status == "warning"
    assert "then came back" in c.finding().evidence


def test_outcome_above_alone_is_healthy():
    c = compare("run", process(102, onset=30, accuracy_shift=+0.2), REFS)
    d = c.metrics["rollout/accuracy"].departure
    assert d is not None and d.direction == "above"
    assert [x.metric for x in c.departures] == ["rollout/accuracy"] and c.status == "healthy"


def test_false_alarm_rate_on_runs_of_the_same_process():
    """50 runs drawn from the references' own process (each its own rate and level), 4
    references: at most 5 flagged (alpha 0.05: 2.5 expected; 5 or more has probability 0.1)."""
    alarms = sum(compare("run", process(seed), REFS).status != "healthy" for seed in range(200, 250))
    assert alarms <= 5, alarms


def white(seed, n=64, level=0.0):
    """A run of pure noise around flat courses, for the stated false-alarm rate."""
    rng = np.random.default_rng(seed)
    return [
        {
            "step": t,
            "rollout/accuracy": 0.5 + level + 0.05 * rng.normal(),
            "actor/entropy": float(np.exp(0.1 * rng.normal())),
            "actor/grad_norm": float(np.exp(0.2 * rng.normal())),
            "rollout/truncation_rate": 0.1 + 0.02 * rng.normal(),
        }
        for t in range(n)
    ]


@pytest.mark.parametrize("n_refs", [1, 8])
def test_the_stated_false_alarm_rate_holds_where_the_noise_model_is_true(n_refs):
    """No between-run spread and independent noise: the model holds, so at most ``alpha`` of
    the runs depart, over 4 metrics and 7 blocks each (Bonferroni: a little below alpha).
    200 runs: 10 expected at most; 17 or more has probability < 0.05."""
    refs_ = [Reference(f"w{s}", Path(f"w{s}"), "run", white(s)) for s in range(n_refs)]
    alarms = sum(compare("run", white(s), refs_).status != "healthy" for s in range(1000, 1200))
    assert alarms <= 16, alarms


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.2, 5.0), st.floats(-0.3, 0.3))
def test_a_level_offset_from_the_start_is_not_a_departure(seed, factor, shift):
    """Another batch size (grad norm x factor), another prompt set's length, an accuracy offset
    from the first row: the run's verdict is the same as without the offset."""
    run = process(seed, onset=40, entropy_shift=-0.2)
    moved = [
        {
            **r,
            "actor/grad_norm": r["actor/grad_norm"] * factor,
            "actor/entropy": r["actor/entropy"] * factor,
            "rollout/accuracy": r["rollout/accuracy"] + shift,
        }
        for r in run
    ]
    a, b = compare("run", run, REFS), compare("run", moved, REFS)
    for k in a.metrics:
        da, db = a.metrics[k].departure, b.metrics[k].departure
        assert (da is None) == (db is None), k
        if da is not None:
            assert (da.step, da.direction) == (db.step, db.direction) and np.isclose(da.z, db.z), k
    assert a.status == b.status


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000),
    st.floats(-50, 50, allow_nan=False),
    st.floats(0.01, 100),
    st.sampled_from(["step", "share"]),
)
def test_every_run_shifted_or_scaled_alike_changes_nothing(seed, c, k, align):
    """A metric in other units (every run times ``k``, plus ``c``): the same departures."""

    def moved(rows):
        return [{**r, "rollout/accuracy": r["rollout/accuracy"] * k + c} for r in rows]

    run = process(seed, onset=40, accuracy_shift=-0.2)
    cfg = AgainstConfig(align=align)
    a = compare("run", run, REFS, cfg).metrics["rollout/accuracy"]
    b = compare(
        "run", moved(run), [Reference(r.name, r.path, r.label, moved(r.run)) for r in REFS], cfg
    ).metrics["rollout/accuracy"]
    assert np.allclose((np.array(b.low) - c) / k, a.low, rtol=1e-6, atol=1e-6 * (1 + abs(c) / k))
    assert (a.departure is None) == (b.departure is None)
    if a.departure is not None and b.departure is not None:
        assert (a.departure.step, a.departure.direction) == (b.departure.step, b.departure.direction)
        assert np.isclose(a.departure.z, b.departure.z, rtol=1e-6)


def test_a_log_written_half_as_often_or_with_steps_relabelled_gives_the_same_departure():
    run = process(105, n=160, length=160, onset=100, entropy_shift=-0.25)
    refs8 = refs(range(8), n=160, length=160)
    full = compare("run", run, refs8).metrics["actor/entropy"].departure
    assert full is not None and full.direction == "below" and 97 <= full.step <= 103

    def half(rows):
        return rows[::2]

    def relabel(rows):
        return [{**r, "step": 10 * r["step"]} for r in rows]

    thin = compare("run", half(run), [Reference(r.name, r.path, r.label, half(r.run)) for r in refs8])
    d = thin.metrics["actor/entropy"].departure
    assert d is not None and d.direction == "below" and 96 <= d.step <= 104
    scaled = compare("run", relabel(run), [Reference(r.name, r.path, r.label, relabel(r.run)) for r in refs8])
    d = scaled.metrics["actor/entropy"].departure
    assert d is not None and d.step == 10 * full.step and np.isclose(d.z, full.z)


def test_detection_rate_over_seeds():
    found = 0
    for seed in range(300, 330):
        d = (
            compare("run", process(seed, onset=45, entropy_shift=-0.25), REFS)
            .metrics["actor/entropy"]
            .departure
        )
        found += d is not None and 43 <= d.step <= 50
    assert found >= 28, found


def test_one_reference_uses_noise_only_and_says_so():
    one = refs([0], between=0.0)
    hit = compare("run", process(100, onset=50, entropy_shift=-0.2, between=0.0), one)
    d = hit.metrics["actor/entropy"].departure
    assert hit.metrics["actor/entropy"].references == 1 and hit.one_reference
    assert d is not None and d.direction == "below" and 48 <= d.step <= 53
    assert "one reference: the band is its and this run's noise only" in hit.finding().evidence
    assert hit.as_dict()["one_reference"] is True
    alarms = sum(compare("run", process(s, between=0.0), one).status != "healthy" for s in range(400, 450))
    assert alarms <= 5, alarms  # same process, no between-run spread: the noise band holds
    # runs that differ in their course (each its own rate): one reference cannot know it, and says so
    spread = sum(compare("run", process(s), refs([0])).status != "healthy" for s in range(400, 450))
    assert spread > 10
    assert not compare("run", process(400), REFS).one_reference


def test_align_by_share_for_references_of_another_length():
    long_refs = refs(range(8), n=160, length=160)
    cfg = AgainstConfig(align="share")
    healthy = sum(compare("run", process(s), long_refs, cfg).status != "healthy" for s in range(500, 520))
    assert healthy <= 2, healthy
    c = compare("run", process(100, onset=50, entropy_shift=-0.3), long_refs, cfg)
    d = c.metrics["actor/entropy"].departure
    assert d is not None and d.direction == "below" and 48 <= d.step <= 53
    # by step, references four times as long read at steps 0-79 are the first quarter of their run:
    # a false departure (the share alignment is what such references need)
    longer = refs(range(8), n=320, length=320)
    assert compare("run", process(100), longer, cfg).status == "healthy"
    assert compare("run", process(100), longer).metrics["actor/entropy"].departure is not None


def test_run_longer_than_references_is_judged_where_they_reach():
    short = refs(range(4), n=40)
    c = compare("run", process(100), short)
    assert c.metrics["actor/entropy"].steps[-1] == 39
    assert "eval/score" not in c.metrics and "eval/score" not in c.skipped  # not logged by either


@settings(max_examples=40, deadline=None)
@given(st.floats(1e-6, 0.2), st.floats(1, 200))
def test_t_quantile_matches_scipy(p, df):
    stats = pytest.importorskip("scipy.stats")
    assert t_quantile(p, df) == pytest.approx(float(stats.t.isf(p, df)), rel=2e-3)
    assert t_quantile(p, math.inf) == pytest.approx(float(stats.norm.isf(p)), rel=1e-6)


def test_config_is_checked():
    with pytest.raises(ValueError, match="align"):
        AgainstConfig(align="time")
    with pytest.raises(ValueError, match="alpha"):
        AgainstConfig(alpha=0)
    with pytest.raises(ValueError, match="blocks"):
        AgainstConfig(blocks=2)
    with pytest.raises(ValueError, match="min_points"):
        AgainstConfig(min_points=4)


# ---- the command -------------------------------------------------------------------------------


def write(path, rows, **labels):
    path.write_text("".join(json.dumps({**labels, **r}) + "\n" for r in rows))
    return path


def multi(path, runs):
    path.write_text(
        "".join(
            json.dumps({"experiment": "x", "arm": arm, "seed": s, **r}) + "\n"
            for arm, s, rows in runs
            for r in rows
        )
    )
    return path


def test_cli_text_json_report_and_fail_on(tmp_path, capsys):
    refs_file = multi(tmp_path / "refs.jsonl", [("healthy", s, process(s)) for s in range(4)])
    run = write(tmp_path / "run.jsonl", process(100, onset=40, entropy_shift=-0.3, accuracy_shift=-0.25))
    assert main([str(run), "--against", f"{refs_file}#arm=healthy"]) == 0
    out = capsys.readouterr().out
    assert "failing  Against reference runs since step" in out
    assert "against 4 reference run(s), aligned by step; false-alarm rate 0.05" in out
    assert "actor/entropy below from step" in out and "followed by rollout/accuracy below" in out
    assert main([str(run), "--against", str(refs_file), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["run"]
    assert data["verdict"] == "failing"
    assert data["against"]["status"] == "failing"
    assert data["against"]["metrics"]["actor/entropy"]["departure"]["direction"] == "below"
    assert any(f["rule"] == "against" for f in data["findings"])
    assert main([str(run), "--against", str(refs_file), "--report", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Against reference runs" in md and "| actor/entropy | 80 | step" in md
    capsys.readouterr()
    healthy = write(tmp_path / "ok.jsonl", process(103))
    assert main([str(healthy), "--against", str(refs_file), "--fail-on", "failing"]) == 0
    # accuracy 0.25 below from step 40: the rules see a run that still learns; the references do not
    # (0.15 needs 8 references: with 4 the spread is known on 3 degrees of freedom)
    lower = write(tmp_path / "low.jsonl", process(107, onset=40, accuracy_shift=-0.25))
    assert main([str(lower), "--fail-on", "failing"]) == 0
    assert main([str(lower), "--against", str(refs_file), "--fail-on", "failing"]) == EXIT_FAIL
    assert main([str(healthy), "--against", str(refs_file), "--align", "share"]) == 0
    assert "aligned by share" in capsys.readouterr().out


def test_a_multi_run_file_against_its_own_other_runs(tmp_path):
    """A run of a multi-run file judged against the same file: the run itself is left out."""
    both = multi(tmp_path / "all.jsonl", [("healthy", s, process(s)) for s in range(5)])
    runs = {"experiment=x/arm=healthy/seed=0": process(0)}
    out = compare_all(str(both), runs, load_references([str(both)]))
    assert len(out["experiment=x/arm=healthy/seed=0"].references) == 4


def last_line(capsys):
    """The error: the last line of stderr (the run's reading notes come before it), and no
    traceback."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    run = write(tmp_path / "run.jsonl", process(100))
    missing = tmp_path / "nope.jsonl"
    assert main([str(run), "--against", str(missing)]) == EXIT_USAGE
    err = last_line(capsys)
    assert str(missing) in err and err.startswith("dapo diagnose: --against") and "no such file" in err
    readme = tmp_path / "README.md"
    readme.write_text("# a readme\n\nno metrics here\n")
    assert main([str(run), "--against", str(readme)]) == EXIT_USAGE
    err = last_line(capsys)
    assert str(readme) in err and "Traceback" not in err
    other = write(tmp_path / "other.jsonl", [{"step": i, "rollout/length_mean": 10.0 + i} for i in range(30)])
    assert main([str(run), "--against", str(other)]) == EXIT_USAGE
    err = last_line(capsys)
    assert str(other) in err and "shares no compared metric" in err
    refs_file = multi(tmp_path / "refs.jsonl", [("healthy", 0, process(0))])
    assert main([str(run), "--against", f"{refs_file}#arm=sick"]) == EXIT_USAGE
    err = last_line(capsys)
    assert "no run labelled 'arm=sick'" in err and str(refs_file) in err


def test_on_the_calibration_pairs_failed_runs_depart_and_healthy_ones_stay_above():
    """benchmarks/against_pairs.py: a failed run against the healthy run of its trainer (one
    reference) has its outcome depart below in 4 of 6 pairs; the healthy run against the failed
    one, in none."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("against_pairs", ROOT / "benchmarks" / "against_pairs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [(mod.judge(f, h), mod.judge(h, f)) for f, h in mod.PAIRS]
    assert sum(a["outcome_below_from"] is not None for a, _ in rows) >= 4
    assert sum(b["outcome_below_from"] is None for _, b in rows) == 6
    assert all(b["status"] != "failing" for _, b in rows)


def test_references_given_one_flag_each_are_all_used_and_constant_ones_give_finite_words(tmp_path, capsys):
    """`--against a --against b` is two references, as `--against a b` is. References whose entropy
    is constant (a logger that repeats a value; a frozen module): the band is this run's noise, a
    run that stays level is within it, one that falls is below, and no figure is absurd."""
    files = []
    for s in range(3):
        rows = process(s)
        for r in rows:
            r["actor/entropy"] = 0.5
        files.append(write(tmp_path / f"ref{s}.jsonl", rows))
    level = process(10)
    for r in level:
        r["actor/entropy"] = 0.5 + 0.002 * ((r["step"] * 7919) % 13) / 13
    assert (
        main(
            [
                str(write(tmp_path / "level.jsonl", level)),
                *[a for f in files for a in ("--against", str(f))],
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)["run"]["against"]
    assert len(data["references"]) == 3
    assert data["metrics"]["actor/entropy"]["departure"] is None
    falls = [
        dict(r, **{"actor/entropy": r["actor/entropy"] * (0.5 if r["step"] >= 40 else 1.0)}) for r in level
    ]
    assert main([str(write(tmp_path / "falls.jsonl", falls)), "--against", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert "against 3 reference run(s)" in out and "actor/entropy below from step" in out
    assert "e+0" not in out and "inf" not in out and "nan" not in out
