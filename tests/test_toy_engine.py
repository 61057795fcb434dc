"""The batched toy engine against the per-run loop it replaces (toybench.runner.train).

What must hold: every run's trajectory (sampled tokens, hence every rollout metric, and its
softmax table) is bit-for-bit the loop's; metrics that reduce over a run's tokens agree to
the last bits; a run's result does not depend on which runs share its batch; and the
verdicts and intervals of an experiment are the loop's."""

import math

import pytest
import torch

import toybench.runner as runner
from dapo import AlgoConfig
from toybench import engine
from toybench.engine import batch_key, train_many
from toybench.experiment import run_experiments, with_steps
from toybench.experiments import REGISTRY
from toybench.health_suite import FAULTS
from toybench.ladder import ladder_experiment
from toybench.runner import RunSpec, train
from toybench.scheduler import plan

pytestmark = pytest.mark.slow  # ~30 s: many short toy runs, two of them in worker processes

EXACT = (
    "rollout/",
    "sampling/",
    "cost/",
    "toy/gen_time",
    "toy/truncated_on_track",
    "toy/length_",
    "toy/best_path_prob",
)
EXACT_KEYS = {
    "actor/optimizer_steps",
    "actor/skipped_steps",
    "actor/empty_windows",
    "actor/loss_tokens",
    "actor/filtered_responses",
    "step",
}


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_logs_match(ref, got, where=""):
    assert len(ref) == len(got)
    for step, (mr, mg) in enumerate(zip(ref, got)):
        assert list(mr) == list(mg), (where, step, set(mr) ^ set(mg))
        for k, v in mr.items():
            if k.startswith(EXACT) or k in EXACT_KEYS:
                assert _same(v, mg[k]), (where, step, k, v, mg[k])
            else:
                assert _same(v, mg[k]) or abs(v - mg[k]) <= 1e-12 * max(1.0, abs(v)), (
                    where,
                    step,
                    k,
                    v,
                    mg[k],
                )


def _loop_with_tables(specs):
    """The loop's logs and final tables (the policy is captured as train builds it)."""
    tables, logs = [], []
    make = runner.make_policy

    def capture(spec, task, gen):
        policy = make(spec, task, gen)
        tables.append(policy)
        return policy

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "make_policy", capture)
        for s in specs:
            logs.append(train(s))
    return logs, [p.table.detach() for p in tables]


def _engine_with_tables(specs):
    eng = engine._Engine(list(specs))
    return eng.run(None), eng.table.detach()


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_arm_matches_the_per_run_loop_bitwise(name):
    exp = REGISTRY[name]
    specs = [exp.spec(arm, seed, steps=6) for arm in exp.arms for seed in (0, 7)]
    groups = {}
    for s in specs:
        groups.setdefault(batch_key(s), []).append(s)
    for members in groups.values():  # arms with different windows and configs share one batch
        ref, ref_tables = _loop_with_tables(members)
        got, table = _engine_with_tables(members)
        for i, s in enumerate(members):
            assert_logs_match(ref[i], got[i], (name, s.seed, s.cfg.loss_agg))
            assert torch.equal(ref_tables[i], table[i]), (name, i)  # the trajectory, bit for bit


@pytest.mark.parametrize("exp_name", ["entropy_collapse", "length_bias"])
def test_other_policy_losses_match_the_loop_and_share_a_batch(exp_name):
    """Runs with different policy losses (native over runs, and lifted by per_run: one call
    for all runs through vmap, or one call per run for a loss vmap cannot run) stack in one
    batch and each follows the loop's trajectory bit for bit."""
    from dataclasses import replace

    exp = REGISTRY[exp_name]
    arm = next(iter(exp.arms))
    specs = [
        replace(exp.spec(arm, seed, steps=6), loss=loss)
        for loss in (
            "dapo",
            "gspo",
            "cispo",
            "kl_cov",
            "broken_losses:per_sequence",
            "broken_losses:paper_dapo",
        )
        for seed in (0, 5)
    ]
    assert len({batch_key(s) for s in specs}) == 1
    ref, ref_tables = _loop_with_tables(specs)
    got, table = _engine_with_tables(specs)
    for i, s in enumerate(specs):
        assert_logs_match(ref[i], got[i], (exp_name, s.loss, s.seed))
        assert torch.equal(ref_tables[i], table[i]), (s.loss, s.seed)
    # the losses do differ: the tables of seed 0 are not all the same
    assert len({tuple(table[i].flatten().tolist()[:50]) for i in range(0, len(specs), 2)}) > 1


def test_a_loss_gets_only_its_runs_window_beside_an_arm_that_splits_its_rows_otherwise():
    """In zero_gradient's batch the dynamic-sampling arm keeps fewer groups than the arm without
    it when rounds run out, so their windows cover different rows and one window slot spans
    rows of several windows. A loss that is not built in gets exactly its run's window, as the
    loop gives it (it used to get the slot's other rows too, fully masked: a loss NaN on such
    a row skipped steps the loop never skips, and a per-response mean counted them)."""
    from dataclasses import replace

    exp = REGISTRY["zero_gradient"]
    no_ds, ds = exp.arms
    assert exp.arms[ds].cfg.dynamic_sampling and not exp.arms[no_ds].cfg.dynamic_sampling
    losses = ("broken_losses:nan_on_empty_rows", "broken_losses:paper_dapo", "kl_cov")
    specs = [exp.spec(ds, seed, steps=40) for seed in (0, 3)] + [
        replace(exp.spec(no_ds, seed, steps=40), loss=loss) for loss in losses for seed in (0, 3)
    ]
    assert len({batch_key(s) for s in specs}) == 1
    ref, ref_tables = _loop_with_tables(specs)
    got, table = _engine_with_tables(specs)
    for i, s in enumerate(specs):
        assert_logs_match(ref[i], got[i], (s.loss, s.seed))
        assert torch.equal(ref_tables[i], table[i]), (s.loss, s.seed)
    kept = [m["actor/optimizer_steps"] for log in got[:2] for m in log]
    assert min(kept) < max(kept)  # the dynamic-sampling runs did split their rows otherwise
    assert all(m.get("actor/skipped_steps", 0) == 0 for log in got for m in log)


def test_ladder_variants_and_injected_nan_steps_match_the_loop():
    lad = ladder_experiment(steps=5)
    specs = [lad.spec(arm, 3) for arm in lad.arms] + [FAULTS.spec("nan_steps", 2, steps=12)]
    specs[-1] = RunSpec(**{**specs[-1].__dict__, "nan_steps": (1, 5, 6)})
    for s in specs:
        assert batch_key(s) is not None
    by_key = {}
    for s in specs:
        by_key.setdefault(batch_key(s), []).append(s)
    for members in by_key.values():
        ref, ref_tables = _loop_with_tables(members)
        got, table = _engine_with_tables(members)
        for i in range(len(members)):
            assert_logs_match(ref[i], got[i])
            assert torch.equal(ref_tables[i], table[i])
    nan_log = got[-1] if members[-1].nan_steps else None
    assert nan_log is not None and [m["actor/skipped_steps"] > 0 for m in nan_log].count(True) == 3


def _assert_batched_equals_loop(specs, where):
    """Runs sharing a batch key train together on the engine; each equals the loop, bit for bit."""
    by_key = {}
    for s in specs:
        assert batch_key(s) is not None, s
        by_key.setdefault(batch_key(s), []).append(s)
    for members in by_key.values():
        ref, ref_tables = _loop_with_tables(members)
        got, table = _engine_with_tables(members)
        for i, s in enumerate(members):
            assert_logs_match(ref[i], got[i], (where, s.seed))
            assert torch.equal(ref_tables[i], table[i]), (where, s.seed)
    return by_key


def test_prompt_selection_and_drift_match_the_loop_bitwise():
    """Every arm of the prompt-selection family (no filter, dynamic sampling, GRESO, retire,
    pools; each with the task drifting) on the engine: each run keeps its own history and
    stream, and its log and table are the loop's."""
    from dataclasses import replace

    from toybench.experiments.prompt_selection import EXPERIMENT

    specs = [
        replace(EXPERIMENT.spec(arm, seed, steps=10), drift_at=6 if EXPERIMENT.arms[arm].drift_at else None)
        for arm in EXPERIMENT.arms
        for seed in (0, 7)
    ]
    by_key = _assert_batched_equals_loop(specs, "prompt_selection")
    assert len(by_key) == 2  # the drifting arms share one batch, the stationary ones another
    drifted = next(m for m in by_key.values() if m[0].drift_at is not None)
    got = train_many(drifted)
    assert all("toy/expected_accuracy_drifted" in m for log in got for m in log)
    assert any(m["sampling/skipped_prompts"] > 0 for log in got for m in log)


OFF_POLICY_SAMPLE = (
    "dapo_k1_token_tis",
    "dapo_k2_seq_mis",
    "dapo_k4_partial_decoupled",
    "dapo_k8_bypass",
    "dapo_k2_k3_rs",
    "dapo_k1_geo_rs",
    "grpo_k2_partial_none",
    "dapo_bf16_icepop",
    "dapo_fp8_geo_rs",
)


def test_off_policy_arms_match_the_loop_bitwise():
    """A sample of the off-policy grid (every correction family, partial rollouts, both engine
    precisions) on the engine against the loop, where each stale batch goes through
    ``dapo.update`` as the trainer's does (``rollout_logp``, the correction of its config)."""
    from toybench.off_policy import grid_experiment

    grid = grid_experiment()
    specs = [grid.spec(arm, seed, steps=10) for arm in OFF_POLICY_SAMPLE for seed in (0, 7)]
    _assert_batched_equals_loop(specs, "off_policy")


def test_stale_failure_mode_arms_and_a_late_staleness_match_the_loop():
    from dataclasses import replace

    from toybench.off_policy import protection_experiments

    specs = []
    for exp in protection_experiments(staleness=(2,)):
        for arm in exp.arms:
            specs.append(exp.spec(arm, 3, steps=8))
    specs.append(replace(specs[0], staleness=3, staleness_from=4, partial=True))
    _assert_batched_equals_loop(specs, "protection")


def test_a_run_does_not_depend_on_its_batch():
    exp = REGISTRY["zero_gradient"]  # dynamic sampling: runs draw different numbers of rounds
    together = train_many([exp.spec(arm, s, steps=8) for arm in exp.arms for s in (0, 1, 2)])
    alone = train_many([exp.spec("dynamic_sampling", 1, steps=8)])
    assert together[4] == alone[0] or all(_same(a[k], b[k]) for a, b in zip(together[4], alone[0]) for k in a)


def test_a_batch_mate_with_nan_steps_takes_nothing_from_a_run():
    """A run batched with one whose log-probs are made NaN (the health suite's fault) keeps
    every step: the NaN once leaked through the backward of ``logp * nan`` (0 * nan)."""
    from toybench.health_suite import FAULTS

    clean = FAULTS.spec("nan_steps", 0, steps=12)
    clean = RunSpec(**{**clean.__dict__, "nan_steps": ()})
    faulty = FAULTS.spec("nan_steps", 1, steps=12)
    alone = train_many([clean])[0]
    mixed = train_many([faulty, clean])
    assert_logs_match(alone, mixed[1])
    assert mixed[0][5]["actor/skipped_steps"] > 0 and mixed[1][5]["actor/skipped_steps"] == 0


def test_underfilled_dynamic_sampling_batches_match_the_loop():
    # one generation round allowed: the batch is often short of train_groups
    cfg = REGISTRY["zero_gradient"].arms["dynamic_sampling"].cfg.replace(max_gen_rounds=1)
    specs = [RunSpec(task="zero_grad", cfg=cfg, steps=10, lr=20.0, seed=s) for s in (0, 1)]
    ref, ref_tables = _loop_with_tables(specs)
    got, table = _engine_with_tables(specs)
    assert any(m["sampling/underfilled"] for log in ref for m in log)
    for i in range(2):
        assert_logs_match(ref[i], got[i])
        assert torch.equal(ref_tables[i], table[i])


def test_filtered_group_stats_variants_match_the_loop():
    base = REGISTRY["truncation_noise"].arms["soft"].cfg.replace(dynamic_sampling=True, max_gen_rounds=3)
    specs = [
        RunSpec(task="truncation", cfg=base.replace(filtered_group_stats=v), steps=6, lr=20.0, seed=4)
        for v in ("shaped", "unpenalized", "excluded")
    ]
    ref, ref_tables = _loop_with_tables(specs)
    got, table = _engine_with_tables(specs)
    for i in range(3):
        assert_logs_match(ref[i], got[i])
        assert torch.equal(ref_tables[i], table[i])
    # the knob changes the run (else the comparison above proves nothing)
    assert not torch.equal(table[0], table[1]) and not torch.equal(table[0], table[2])


def test_verdicts_and_intervals_match_the_loop():
    exps = [with_steps(REGISTRY["length_bias"], 12), with_steps(REGISTRY["zero_gradient"], 12)]
    a = run_experiments(exps, seeds=3, jobs=1, engine="batched", progress=False)
    b = run_experiments(exps, seeds=3, jobs=1, engine="loop", progress=False)
    for ra, rb in zip(a, b):
        for ca, cb in zip(ra.contrasts, rb.contrasts):
            assert ca.verdict == cb.verdict
            for block in ca.blocks:
                ia, ib = ca.blocks[block].interval, cb.blocks[block].interval
                assert ia.n == ib.n
                for x, y in ((ia.mean, ib.mean), (ia.low, ib.low), (ia.high, ib.high)):
                    assert _same(x, y) or abs(x - y) <= 1e-9, (ca.contrast.name, block, ia, ib)


def test_results_do_not_depend_on_the_worker_count():
    exp = with_steps(REGISTRY["truncation_noise"], 4)
    one = run_experiments([exp], seeds=2, jobs=1, progress=False)[0]
    two = run_experiments([exp], seeds=2, jobs=2, progress=False)[0]
    for arm in exp.arms:
        for seed in one.seeds:
            assert one.logs[arm][seed] == two.logs[arm][seed] or all(
                _same(x[k], y[k]) for x, y in zip(one.logs[arm][seed], two.logs[arm][seed]) for k in x
            )


def test_what_the_engine_cannot_batch_goes_to_the_loop():
    cfg = AlgoConfig(group_size=4, train_groups=4, mini_batch_groups=2, expected_len=4, cache_len=2)
    gru = RunSpec(task="zero_grad", cfg=cfg, steps=2, lr=1e-3, policy="gru")
    noisy = RunSpec(task="zero_grad", cfg=cfg, steps=2, lr=1.0, engine_noise=0.1)
    plain = RunSpec(task="zero_grad", cfg=cfg, steps=2, lr=1.0)
    assert batch_key(gru) is None and batch_key(noisy) is None and batch_key(plain) is not None
    jobs = plan(
        [(("x", "a", 0), gru), (("x", "b", 0), noisy), (("x", "c", 0), plain), (("x", "c", 1), plain)]
    )
    assert sorted((j.batched, len(j.runs)) for j in jobs) == [(False, 1), (False, 1), (True, 2)]
    with pytest.raises(ValueError, match="share one batch_key"):
        train_many([plain, gru])
    with pytest.raises(ValueError, match="share one batch_key"):
        train_many([plain, RunSpec(task="zero_grad", cfg=cfg, steps=3, lr=1.0)])
    assert [len(j.runs) for j in plan([(("x", "c", i), plain) for i in range(45)], max_runs=20)] == [
        15,
        15,
        15,
    ]
    with pytest.raises(ValueError, match="engine must be"):
        plan([], engine="gpu")


def test_engine_checks_the_task_geometry():
    cfg = AlgoConfig(group_size=4, train_groups=4, mini_batch_groups=2, expected_len=4, cache_len=3)
    with pytest.raises(ValueError, match="must equal the task's max_len 6"):
        train_many([RunSpec(task="zero_grad", cfg=cfg, steps=1, lr=1.0)])
    assert train_many([]) == []


def test_split_ids_is_tensor_split():
    for n, k in ((32, 4), (24, 4), (8, 3), (16, 1), (0, 1)):
        ids = engine._split_ids(torch.tensor([n]), torch.tensor([k]), 40)[0]
        want = torch.full((40,), -1)
        for w, part in enumerate(torch.tensor_split(torch.arange(n), k)):
            want[part] = w
        assert torch.equal(ids, want), (n, k)


def test_progress_bar_on_a_terminal_and_in_a_log():
    import io

    from dapo.progress import Progress

    out = io.StringIO()
    bar = Progress(10, "toy runs", delay=0.0, stream=out, force=True)
    bar.update(5)
    bar.close()
    text = out.getvalue()
    assert "toy runs [" in text and " 50%" in text and text.endswith("\n")
    log = io.StringIO()  # not a terminal (a CI log, nox): plain lines, no carriage returns
    bar = Progress(10, "toy runs", delay=0.0, stream=log, log_every=0.0)
    bar.update(4)
    bar.update(10)  # the end is not logged: the command's own output follows
    bar.close()
    assert log.getvalue() == "toy runs: 40% (4/10) after 0 s, ~0 s left\n"
    quiet = io.StringIO()  # a short run in a log writes nothing
    bar = Progress(10, "toy runs", delay=0.0, stream=quiet)
    bar.update(5)
    bar.close()
    assert quiet.getvalue() == ""
    off = io.StringIO()  # --quiet
    bar = Progress(10, "toy runs", delay=0.0, stream=off, force=True, enabled=False)
    bar.update(5)
    bar.close()
    assert off.getvalue() == ""
    status = io.StringIO()  # a status and a resumed start: the time left counts the work since
    bar = Progress(10, "dapo train", delay=0.0, stream=status, log_every=0.0, start=5)
    bar.update(6, "acc=0.500")
    assert status.getvalue().startswith("dapo train: 60% (6/10) after 0 s, ~") and status.getvalue().endswith(
        " s left acc=0.500\n"
    )
    term = io.StringIO()  # clear() erases a drawn bar before a line is printed under it
    bar = Progress(10, "dapo train", delay=0.0, stream=term, force=True)
    bar.update(3, "acc=0.1")
    bar.clear()
    assert term.getvalue().endswith("\r\x1b[K") and "acc=0.1" in term.getvalue()
    late = io.StringIO()  # short runs draw nothing before the delay
    bar = Progress(10, "toy runs", delay=60.0, stream=late, force=True)
    bar.update(3)
    bar.close()
    assert late.getvalue() == ""


def test_progress_bar_draws_its_last_state_once_and_ends_its_line_on_an_interrupt():
    """The finished bar is not drawn a second time by close() (a line wider than the terminal
    would show twice), and a block interrupted under ``with Progress(...)`` leaves the bar's
    line ended, so that the interrupt's message starts on a line of its own."""
    import io

    from dapo.progress import Progress

    out = io.StringIO()
    bar = Progress(5, "dapo train", delay=0.0, stream=out, force=True)
    bar.update(5, "acc=0.083")
    bar.close()
    assert out.getvalue().count("5/5") == 1 and out.getvalue().endswith("\n")
    out = io.StringIO()
    with (
        pytest.raises(KeyboardInterrupt),
        Progress(5, "dapo train", delay=0.0, stream=out, force=True) as bar,
    ):
        bar.update(2, "acc=0.1")
        raise KeyboardInterrupt
    assert out.getvalue().count("2/5") == 1 and out.getvalue().endswith("\n")


def test_quiet_toy_commands_still_say_how_far_they_are(capsys, monkeypatch, tmp_path):
    """``--quiet`` drops the bar, not every sign of life: a plain progress line every 30 s
    (``$DAPO_QUIET_PROGRESS_S``; 0 here) on stderr, on a terminal too (``nox -s toy``, the
    off-policy family: minutes of work); a short run prints none at the default interval."""
    from dapo.cli import main as dapo_main
    from toybench.scheduler import QUIET_EVERY_S, quiet_every

    args = ["toy", "run", "length_bias", "--seeds", "2", "--steps", "4", "--no-confirm", "--jobs", "1"]
    args += ["--quiet", "--no-plots", "--out", str(tmp_path / "toy")]
    monkeypatch.setenv("DAPO_QUIET_PROGRESS_S", "0")
    assert dapo_main(args) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("toy runs: ")]
    assert lines and " after " in lines[0] and "\r" not in err, err
    monkeypatch.delenv("DAPO_QUIET_PROGRESS_S")
    assert quiet_every() == QUIET_EVERY_S == 30.0
    assert dapo_main(args) == 0
    assert "toy runs" not in capsys.readouterr().err  # a few seconds: nothing to report
    monkeypatch.setenv("DAPO_QUIET_PROGRESS_S", "soon")
    assert quiet_every() == QUIET_EVERY_S


def test_a_failing_worker_is_reported_not_hung():
    from toybench.scheduler import Job, execute

    cfg = AlgoConfig(group_size=4, train_groups=4, mini_batch_groups=2, expected_len=4, cache_len=2)
    good = Job(((("x", "a", 0), RunSpec(task="zero_grad", cfg=cfg, steps=400, lr=1.0)),), batched=True)
    bad = Job(((("x", "b", 0), RunSpec(task="no_such_task", cfg=cfg, steps=1, lr=1.0)),), batched=True)
    with pytest.raises(RuntimeError, match=r"toy worker failed on job 1:(.|\n)*unknown task 'no_such_task'"):
        execute([good, bad], workers=2, show_progress=False)
    # the same report when this process, not a spawned worker, ran the failing job (it takes
    # jobs while workers start, so under load either may run it)
    with pytest.raises(RuntimeError, match=r"toy worker failed on job 0:(.|\n)*unknown task 'no_such_task'"):
        execute([bad, good], workers=2, show_progress=False)


def test_a_failing_worker_stops_this_process_at_once():
    """A spawned worker's failure ends the run while this process is still inside its own long
    job (it used to finish that job first: a user's loss that raised in a worker took as long
    to report as this process's share of the work)."""
    import time

    from toybench.scheduler import Job, execute

    cfg = AlgoConfig(group_size=4, train_groups=4, mini_batch_groups=2, expected_len=4, cache_len=2)
    # about 150 s of work on this process (idle machine) if it did not stop
    endless = Job(((("x", "a", 0), RunSpec(task="zero_grad", cfg=cfg, steps=20_000, lr=1.0)),), batched=True)
    bad = Job(((("x", "b", 0), RunSpec(task="no_such_task", cfg=cfg, steps=1, lr=1.0)),), batched=True)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"toy worker failed on job 1:(.|\n)*unknown task 'no_such_task'"):
        execute([endless, bad], workers=2, show_progress=False)
    # the worker's start (importing torch) is most of this; the job alone is minutes
    assert time.monotonic() - t0 < 90
