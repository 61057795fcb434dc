"""The full-regime trainer on a tiny random Qwen2 on CPU (slow: tens of seconds each)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from forkserver import run_dapo
from multiproc import run_script
from scale_support import need

from dapo.pipeline import oldest_token_ages

need("transformers", "accelerate", "datasets", "safetensors", "yaml")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def overrides(tiny, out, *extra):
    return [
        f"model.path={tiny['model']}",
        f"data.train={tiny['train']}",
        f"data.eval={tiny['eval']}",
        f"output.dir={out}",
        f"data.cache_dir={tiny['root'] / 'data-cache'}",
        *extra,
    ]


def run_cli(args, env_extra=None, timeout=600, drop=()):
    """``python -m dapo.cli ARGS`` from the repository root (forked from a process that imported
    the stack once where that is the same: tests/forkserver.py)."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in drop},
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TOKENIZERS_PARALLELISM": "false",
        **(env_extra or {}),
    }
    return run_dapo(args, env=env, cwd=ROOT, timeout=timeout)


def metrics(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def comparable(m):
    return {k: v for k, v in m.items() if not k.startswith(("time/", "sync/seconds"))}


SKIP = ("sync/", "async/")
"""Metrics of the weight exchange and of timing: not compared between runs."""


def same(a, b, tol=1e-6, skip=SKIP):
    """Two runs' metrics, step by step, equal to ``tol`` but for the ``skip`` prefixes."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert_same(
            {k: v for k, v in comparable(x).items() if not k.startswith(skip)},
            {k: v for k, v in comparable(y).items() if not k.startswith(skip)},
            tol=tol,
        )


def assert_same(a, b, tol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if x is None or y is None:
            assert x is None and y is None, k
        elif math.isnan(x) or math.isnan(y):
            assert math.isnan(x) and math.isnan(y), (k, x, y)
        else:
            assert math.isclose(x, y, rel_tol=tol, abs_tol=tol), (k, x, y)


def test_policy_logprobs_equal_a_plain_forward(tiny):
    from transformers import AutoModelForCausalLM

    from scale.learner.policy import Policy, pack

    lm = AutoModelForCausalLM.from_pretrained(tiny["model"], dtype=torch.float32)
    pol = Policy(lm, chunk=5)
    prompt = torch.tensor([[5, 6, 7], [8, 1, 1]])
    plen = torch.tensor([3, 1])
    resp = torch.tensor([[9, 10, 0, 1], [11, 12, 13, 0]])
    logp, _ent = pol(prompt, plen, resp, pad_id=1)
    for row, (p, n) in enumerate(zip(prompt, plen)):
        seq = torch.cat([p[:n], resp[row]]).unsqueeze(0)
        full = torch.log_softmax(lm(seq).logits[0].float(), -1)
        ref = full[n - 1 : n - 1 + resp.shape[1]].gather(-1, resp[row].unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(logp[row], ref, atol=1e-4), (logp[row], ref)
    ids, attn, pos, p_max = pack(prompt, plen, resp, 1)
    assert p_max == 3 and ids[1, :3].tolist() == [1, 1, 8] and attn[1, :3].tolist() == [0, 0, 1]
    assert pos[1, 2].item() == 0 and pos[0, 3].item() == 3


def test_hf_engine_three_steps_and_resume_equals_uninterrupted(tiny, tmp_path):
    """Also the live diagnosis (diagnose.every_steps): verdicts in every row, the same after
    a resume (the monitor is re-seeded from metrics.jsonl)."""
    a, b = tmp_path / "a", tmp_path / "b"
    base = ["train", "--config", "tiny-cpu", "diagnose.every_steps=1"]
    r = run_cli(base + overrides(tiny, a, "rollout.engine=hf"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 1: health: start -> inconclusive" in r.stdout + r.stderr
    full = metrics(a)
    assert [m["step"] for m in full] == [1, 2, 3]
    assert all(m["health/verdict"] in (0, 1, 2, 3) and "health/entropy_collapse" in m for m in full)
    assert sum(m["actor/optimizer_steps"] for m in full) > 0
    # the tiny eval file repeats one of its 8 problems: evaluation runs on the unique ones
    assert "data.eval: 7 unique problems from 8 rows" in r.stdout + r.stderr
    assert full[-1]["eval/problems"] == 7 and "eval/pass@4" in full[-1]
    # a redirected log: no progress-bar frames, and the evaluation is on the console
    assert "\r" not in r.stdout + r.stderr
    assert "step 3: eval on 7 problems: avg@4 " in r.stdout + r.stderr
    r = run_cli(base + overrides(tiny, b, "rollout.engine=hf") + ["--steps", "2"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(metrics(b)) == 2
    r = run_cli(base + overrides(tiny, b, "rollout.engine=hf") + ["--resume", "auto"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr
    resumed = metrics(b)
    assert [m["step"] for m in resumed] == [1, 2, 3]
    for x, y in zip(full, resumed):
        assert_same(comparable(x), comparable(y))
    # the weights too: both runs' last checkpoints, exported, are the same model
    from safetensors.torch import load_file

    exported = []
    for run in (a, b):
        ckpt = sorted((run / "checkpoints").glob("step_*"))[-1]
        assert (ckpt / "state" / ".metadata").is_file() and (ckpt / "rank0.pt").is_file()
        r = run_cli(["eval", "--model", str(ckpt), "--data", str(tiny["eval"])])
        assert r.returncode == 2 and f"dapo export {ckpt}" in r.stderr  # a sharded checkpoint is no model
        r = run_cli(["export", str(ckpt), str(run / "export"), "--dtype", "float32"])
        assert r.returncode == 0, r.stderr[-3000:]
        exported.append(load_file(str(run / "export" / "model.safetensors")))
        trained = json.loads((run / "export" / "dapo_training.json").read_text())  # dapo eval records it
        assert trained["algo"]["policy_loss"] == "dapo" and trained["step"] == int(ckpt.name.split("_")[1])
    # dapo eval of the exported step-3 model repeats the run's in-training evaluation of step 3 (its
    # settings and per-problem seeds, the same engine): the same avg@4; other settings are named
    same = ["--k", "4", "--top-p", "0.7", "--max-new-tokens", "16", "--engine", "hf", "--template", "none"]
    same += ["--chat-template", "false", "--limit", "8", "--dtype", "float32"]
    r = run_cli(["eval", "--model", str(b / "export"), "--data", str(tiny["eval"]), *same])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the settings and per-problem seeds of the run's in-training evaluation at step 3" in r.stderr
    avg = float(next(x for x in r.stdout.splitlines() if x.startswith("eval/avg@4 ")).split()[1])
    assert avg == pytest.approx(full[-1]["eval/avg@4"], abs=1e-4), (avg, full[-1]["eval/avg@4"])
    r = run_cli(
        ["eval", "--model", str(b / "export"), "--data", str(tiny["eval"]), *same, "--k", "2", "--seed", "5"]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "which differs in: k 2 (the run: 4), --seed 5 (the run: its per-problem seeds of step 3)" in r.stderr
    )
    start = load_file(str(tiny["model"] / "model.safetensors"))
    assert exported[0].keys() == exported[1].keys() >= start.keys()
    assert any(not torch.equal(exported[0][k], start[k]) for k in start)  # trained
    for k in start:
        assert torch.allclose(exported[0][k], exported[1][k], atol=1e-6), k
    r = run_cli(["export", str(tmp_path / "nowhere"), str(tmp_path / "x")])
    assert r.returncode == 2 and "nowhere" in r.stderr
    # a checkpoint of a layout this run cannot continue: one line, exit 2, before the model
    # loads, and nothing of the run lost
    last = sorted((b / "checkpoints").glob("step_*"))[-1]
    state = json.loads((last / "trainer_state.json").read_text())
    state["config"]["train"]["sharding"] = "fsdp2"
    (last / "trainer_state.json").write_text(json.dumps(state))
    before = (b / "metrics.jsonl").read_text()
    r = run_cli(base + overrides(tiny, b, "rollout.engine=hf") + ["--resume", "auto"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert (
        f"--resume: {last} was written with train.sharding=fsdp2 and this run has train.sharding=none"
        in r.stderr
    )
    assert (b / "metrics.jsonl").read_text() == before


def test_live_and_offline_health_verdicts_agree_at_every_step(tiny, tmp_path):
    """What a new user does: train with the live diagnosis on, then `dapo diagnose` the run. The
    trainer's health/* values at each diagnosed step equal the offline verdicts on the rows of
    metrics.jsonl up to that step; steps that trained nothing (no accepted group: their actor
    metrics are null) are not read as a non-finite blow-up; steps are the integers printed."""
    from dapo.health import diagnose, verdict
    from dapo.health.readers import read_runs
    from dapo.health.verdict import SEVERITY, VERDICT_CODE

    out = tmp_path / "live"
    r = run_cli(
        [
            "train",
            "--config",
            "tiny-cpu",
            "train.steps=40",
            "diagnose.every_steps=5",
            "output.checkpoint_every=0",
            *overrides(tiny, out, "rollout.engine=hf"),
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    raw = metrics(out)
    assert [m["step"] for m in raw] == list(range(1, 41)) and all(isinstance(m["step"], int) for m in raw)
    idle = [m["step"] for m in raw if m["actor/optimizer_steps"] == 0]
    (run,) = read_runs(out)[0].values()
    diagnosed = [m for m in raw if "health/verdict" in m]
    assert [m["step"] for m in diagnosed] == [5, 10, 15, 20, 25, 30, 35, 40]
    for m in diagnosed:
        fs = diagnose([row for row in run if row["step"] <= m["step"]])
        offline = {f"health/{f.rule}": float(SEVERITY[f.status]) for f in fs}
        offline["health/verdict"] = float(VERDICT_CODE[verdict(fs).status])
        assert {k: m[k] for k in offline} == offline, f"step {m['step']}"
        assert all(f.status != "failing" or "non-finite" not in f.evidence for f in fs)
    for line in (r.stdout + r.stderr).splitlines():  # each printed verdict change is at a diagnosed step
        if ": health: " in line:
            assert int(line.split(":")[0].split()[-1]) in {m["step"] for m in diagnosed}, line
    assert idle == [] or all(run[s - 1].get("actor/grad_norm") is None for s in idle)


def test_vllm_engine_three_steps_weights_stay_in_sync(tiny, tmp_path):
    """One process, colocated vLLM: the engine holds the trainer's weights after every sync.
    (Resume is engine-agnostic: the hf test above checks it in one process, the rehearsal with
    vLLM on four.)"""
    need("vllm")
    a = tmp_path / "a"
    base = ["train", "--config", "tiny-cpu"]
    r = run_cli(base + overrides(tiny, a), drop=("TORCH_CPP_LOG_LEVEL",))  # as a user's shell has it
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NUMA binding" not in r.stdout + r.stderr  # torch's C++ notices are engine logs (--verbose)
    full = metrics(a)
    assert [m["step"] for m in full] == [1, 2, 3]
    assert sum(m["actor/optimizer_steps"] for m in full) > 0
    for m in full:  # engine vs trainer log-probs of the sampled tokens, after every sync
        if m.get("mismatch/logp_gap_max") is not None:
            assert m["mismatch/logp_gap_max"] < 1e-4, m


@pytest.fixture(scope="module")
def one_process_update(tiny, tmp_path_factory):
    """The update of one process on the whole batch, in the order the 2-rank runs split it
    (2 ranks x 2 groups, windows of 2 groups = one group per rank: global windows {0,2}, {1,3}):
    what every sharding below must give. Run once for all of them."""
    one = tmp_path_factory.mktemp("one-process") / "one.pt"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAPO_CHECK_COLLECTIVES", "1")
        run_script(
            [str(Path(__file__).parent / "dp_worker.py"), str(tiny["model"]), str(one), "--order", "0,2,1,3"],
            nproc=1,
        )
    return one


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--sharding", "fsdp2"],
        ["--sharding", "fsdp2", "--max-tokens", "9"],
        ["--sharding", "fsdp2", "--offload"],
    ],
    ids=["ddp", "fsdp2", "fsdp2-packed-token-budget", "fsdp2-offload"],
)
def test_two_gloo_processes_equal_one(tiny, one_process_update, tmp_path, options, monkeypatch):
    """The update on 2 ranks (DDP, or FSDP2 with rank 0 reading the weights and the others
        receiving shards; optionally packed micro-batches by token budget, unequal in number per
        rank before equalisation, or FSDP2's CPU offload) gives the weights of 1 process on the
        whole batch: the exact token-mean and the global grad-norm clip hold across shards. Each
        rank logs the metrics one process logs, and under FSDP2 the weight sync streams exactly
        the trained weights. The collective-device check is on throughout (it must see the
    collectives and raise nothing spurious)."""
    monkeypatch.setenv("DAPO_CHECK_COLLECTIVES", "1")
    worker = str(Path(__file__).parent / "dp_worker.py")
    one, two = one_process_update, tmp_path / "two.pt"
    run_script([worker, str(tiny["model"]), str(two), *options], nproc=2)
    a = torch.load(one, weights_only=True)
    b = torch.load(two, weights_only=True)
    seen = json.loads(Path(f"{two}.collectives.rank1.json").read_text())
    assert sum(seen.values()) > 10, seen  # the check saw the step's collectives
    if "fsdp2" in options:
        streamed = torch.load(f"{two}.stream.pt", weights_only=True)
        assert set(streamed) == set(b) | {"lm_head.weight"} or set(streamed) == set(b)
        for k in b:
            assert torch.equal(streamed[k], b[k]), k
    from safetensors.torch import load_file

    start = load_file(str(tiny["model"] / "model.safetensors"))
    moved = max(float((a[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-3  # the update did something
    for k in start:
        assert torch.allclose(a[k], b[k], atol=1e-6), (k, (a[k] - b[k]).abs().max())
    # the metrics are global: each of the 2 ranks logs what 1 process logs on the whole batch
    # (the loss is not 1/world of it, clip fractions and KL are token-weighted over ranks)
    ref = json.loads(Path(f"{one}.rank0.json").read_text())
    assert {"actor/loss", "actor/clipfrac_upper", "actor/approx_kl", "mismatch/logp_gap"} <= ref.keys()
    assert ref["actor/loss_tokens"] > 0 and math.isfinite(ref["actor/loss"])
    for rank in range(2):
        got = json.loads(Path(f"{two}.rank{rank}.json").read_text())
        assert_same(ref, got, tol=1e-5)


def test_non_finite_loss_is_skipped_and_reported(tiny, tmp_path):
    from scale import trainer as T
    from scale.config import load
    from scale.learner import role as L

    cfg = load(
        "tiny-cpu",
        overrides(
            tiny, tmp_path / "nan", "rollout.engine=hf", "algo.dynamic_sampling=false", "train.steps=1"
        ),
    )
    tr = T.Trainer(cfg)
    before = {k: v.clone() for k, v in tr._unwrapped().lm.state_dict().items()}
    real = L.response_logp

    def poisoned(policy, mb, pad_id):
        logp, ent = real(policy, mb, pad_id)
        return logp * float("nan") if torch.is_grad_enabled() else logp, ent

    L.response_logp = poisoned
    try:
        m = tr.train_step()
    finally:
        L.response_logp = real
    assert m["actor/optimizer_steps"] == 0 and m["actor/skipped_steps"] >= 1
    after = tr._unwrapped().lm.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_malformed_data_and_bad_config_refuse_to_start(tiny, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Q: 1 + 1 = ?", "answer": 2}\n{"prompt": "Q: x", "answer": "two"}\n')
    r = run_cli(
        [
            "train",
            "--config",
            "tiny-cpu",
            *overrides(tiny, tmp_path / "o", "rollout.engine=hf"),
            f"data.train={bad}",
        ]
    )
    assert r.returncode == 2 and f"{bad}:2: answer" in r.stderr
    assert not (tmp_path / "o" / "metrics.jsonl").exists()
    # a prompt that leaves less than the 16-token response ceiling in rollout.max_model_len is
    # refused by row before any model or engine loads, never silently cut short
    long = tmp_path / "long.jsonl"
    long.write_text(
        '{"prompt": "Q: 1 + 1 = ?", "answer": 2}\n' * 2
        + json.dumps({"prompt": "1 + " * 20, "answer": 3})
        + "\n"
    )
    for cmd in (["train"], ["train", "--validate-only"]):
        args = [*cmd, "--config", "tiny-cpu", *overrides(tiny, tmp_path / "o"), f"data.train={long}"]
        r = run_cli([*args, "rollout.max_model_len=48"])
        assert r.returncode == 2 and f"{long}:3: prompt: " in r.stderr, r.stderr[-2000:]
        assert "+ algo.max_len=16 exceed rollout.max_model_len=48" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()
    used = tmp_path / "used"
    used.mkdir()
    (used / "metrics.jsonl").write_text('{"step": 0}\n')
    r = run_cli(["train", "--config", "tiny-cpu", *overrides(tiny, used, "rollout.engine=hf")])
    assert r.returncode == 2 and "previous run" in r.stderr and "--resume auto" in r.stderr
    assert (used / "metrics.jsonl").read_text() == '{"step": 0}\n'  # nothing lost
    # refused after vLLM is imported (and frozen: scale/dist/startup.py): still one line, the
    # last; a frozen heap left at exit had nanobind print ~30 lines of "leaked" triton objects
    r = run_cli(["train", "--config", "tiny-cpu", *overrides(tiny, tmp_path / "r"), "--resume", str(used)])
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("dapo train: "), r.stderr[
        -2000:
    ]
    assert "is not a complete checkpoint" in r.stderr and "leaked" not in r.stderr, r.stderr[-2000:]
    r = run_cli(["train", "--config", "tiny-cpu", "algo.eps_high=-1"])
    assert r.returncode == 2 and "algo.eps_high" in r.stderr
    r = run_cli(
        [
            "train",
            "--config",
            "qwen2.5-32b-dapo",
            "--validate-only",
            f"data.train={tiny['train']}",
            f"data.eval={tiny['eval']}",
        ]
    )
    assert r.returncode == 0 and "valid" in r.stdout


def test_engine_failures_are_clear_errors():
    from scale.generator.engines.base import EngineError, Generation, check_generations
    from scale.generator.engines.vllm_engine import VLLMEngine

    with pytest.raises(EngineError, match="2 samples"):
        check_generations([[Generation([1], [-0.1], "stop")] * 2], 1, 3, 8)
    with pytest.raises(EngineError, match="malformed"):
        check_generations([[Generation([1, 2], [-0.1], "stop")]], 1, 1, 8)

    class HangingLLM:
        def collective_rpc(self, *a, **k):
            import time

            time.sleep(5)

        def reset_prefix_cache(self):
            pass

    eng = object.__new__(VLLMEngine)
    eng.llm, eng.on_gpu, eng.sync_timeout_s, eng.asleep, eng.sleep_during_training = (
        HangingLLM(),
        False,
        0.2,
        False,
        False,
    )
    eng.path = "reload"
    with pytest.raises(EngineError, match="did not finish within"):
        eng.sync_weights([("lm_head.weight", torch.zeros(1))])

    class BrokenLLM(HangingLLM):
        def collective_rpc(self, *a, **k):
            raise RuntimeError("boom")

    eng.llm = BrokenLLM()
    with pytest.raises(EngineError, match="boom"):
        eng.sync_weights([("lm_head.weight", torch.zeros(1))])


def test_per_prompt_seeds_make_samples_independent_of_the_batch(tiny):
    """What lets a run resume on another number of processes: with one seed per prompt, a
    prompt's samples are the same alone, in a batch, or in another order (the HF engine here;
    vLLM seeds each request's generator, checked by the rehearsal's resumes)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scale.generator.engines import make_engine

    tok = AutoTokenizer.from_pretrained(tiny["model"])
    engine = make_engine(
        "hf",
        model=AutoModelForCausalLM.from_pretrained(tiny["model"]),
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
    )
    prompts = [tok(f"Q: {a} + 1 = ?").input_ids for a in range(4)]
    seeds = [11, 12, 13, 14]

    def gen(ps, ss):
        return [[g.token_ids for g in row] for row in engine.generate(ps, n=3, max_tokens=8, seeds=ss)]

    together = gen(prompts, seeds)
    assert together == gen(prompts[:2], seeds[:2]) + gen(prompts[2:], seeds[2:])
    assert together == gen(prompts[::-1], seeds[::-1])[::-1]
    assert together != gen(prompts, [s + 100 for s in seeds])  # the seed matters


# ---- disaggregated placement: generator processes, bounded staleness ---------------------------

DISAGG = ("rollout.engine=hf", "eval.every=0", "rollout.mode=disaggregated", "rollout.generators=2")


def _generator_pids(run_dir):
    """The generator processes of the run writing to ``run_dir`` (from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "scale.placement.generator_process" in args and str(run_dir) in args:
            found[int(args[args.index("--index") + 1])] = int(entry.name)
    return found


def test_disaggregated_k0_equals_colocated(tiny, tmp_path):
    """Two generator processes with their own engines (their own copy of the model, loaded with
    every version the learner publishes) and staleness 0 train exactly what one colocated
    process trains: the same samples (each prompt's seed from its place in the global draw),
    the same dynamic-sampling decisions, the same update, every metric to 1e-6."""
    colo, dis = tmp_path / "colo", tmp_path / "dis"
    base = ["train", "--config", "tiny-cpu"]
    r = run_cli(base + overrides(tiny, colo, "rollout.engine=hf", "eval.every=0"))
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_cli(base + overrides(tiny, dis, *DISAGG))
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = metrics(colo), metrics(dis)
    assert [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b):
        assert {k for k in y if k.startswith("async/")} == {
            "async/staleness_mean",
            "async/staleness_max",
            "async/generator_idle_s",
            "async/trainer_idle_s",
            "async/tokens_in_flight",
        }
        assert y["async/staleness_max"] == 0
        drop = ("sync/", "async/")
        assert_same(
            {k: v for k, v in comparable(x).items() if not k.startswith(drop)},
            {k: v for k, v in comparable(y).items() if not k.startswith(drop)},
        )
    assert (dis / "generator0.log").is_file() and (dis / "generator1.log").is_file()
    assert _generator_pids(dis) == {}  # the generators ended with the run


def test_disaggregated_k2_generator_killed_then_resumed_equals_uninterrupted(tiny, tmp_path):
    """k = 2 with partial rollouts: batch s is sampled by version max(0, s - 3) and, from s = 3,
    continued after the cut by version s - 2, so the oldest tokens are min(s - 1, 2) versions
    old (one fresher where no group of the first round is kept) and the rest one fresher
    (checked on every token before training, and logged). A generator killed
    mid-run ends the run with one line naming it (exit 4); ``--resume auto`` continues from
    the last checkpoint, which holds the batches that were in flight (sampled by versions it no
    longer has), and the resumed run logs exactly the uninterrupted run's metrics."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    base = ["train", "--config", "tiny-cpu"]
    opts = (
        *DISAGG,
        "rollout.max_staleness=2",
        "rollout.partial=true",
        "rollout.partial_tokens=3",
        "train.steps=6",
    )
    r = run_cli(base + overrides(tiny, full, *opts))
    assert r.returncode == 0, r.stderr[-3000:]
    ref = metrics(full)
    # the oldest kept token is min(s - 1, 2) versions old, or one younger where dynamic
    # sampling dropped every group of the batch's first round (which depends on the samples:
    # this machine's floating point)
    ages = [m["async/staleness_max"] for m in ref]
    assert all(
        a in oldest_token_ages(s, 2, partial=True, rounds=int(m["sampling/rounds"]))
        for s, (a, m) in enumerate(zip(ages, ref), 1)
    ), ages
    assert ages[:2] == [0, 1] and max(ages) == 2, ages
    # partial rollouts: from batch 3 on, tokens after the cut come from the next version
    means = [m["async/staleness_mean"] for m in ref]
    assert means[:2] == [0, 1] and all(1 <= x < 2 for x in means[2:]), means
    cfg = json.loads((full / "config.json").read_text())
    assert cfg["algo"]["tis_cap"] == 2.0  # the preset's own correction kept (rollout.correction: auto)

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo.cli", *base, *overrides(tiny, cut, *opts)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    import time

    deadline = time.monotonic() + 300
    while not (cut / "checkpoints" / "step_000001").is_dir() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    pids = _generator_pids(cut)
    assert set(pids) == {0, 1}
    os.kill(pids[0], 9)  # batch 6 needs version 3: generator 0 cannot have finished its work
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 4, err[-3000:]
    assert "generator 0 exited with status -9" in err and "Traceback" not in err, err[-3000:]
    assert "resume with --resume auto" in err
    r = run_cli(base + overrides(tiny, cut, *opts) + ["--resume", "auto"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr
    resumed = metrics(cut)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(ref, resumed):
        assert_same(
            {k: v for k, v in comparable(x).items() if not k.startswith(("sync/", "async/"))},
            {k: v for k, v in comparable(y).items() if not k.startswith(("sync/", "async/"))},
        )
    # resumes that change the schedule (another k, more steps, other generators or learners):
    # tests/test_disaggregated_resume.py


def test_two_learners_and_two_generators_equal_one_learner(tiny, tmp_path):
    """2 learner ranks (DDP, torchrun through tests/multiproc.py) and 2 generator processes, k = 1: rank 0 splits each
    batch as the generators planned and the update is the one 1 learner makes (to 1e-4, sums
    taken in another order); the learners' ranks never wait for the generators' collectives."""
    one, two = tmp_path / "one", tmp_path / "two"
    opts = (*DISAGG, "rollout.max_staleness=1", "train.steps=3", "algo.mini_batch_groups=4")
    r = run_cli(["train", "--config", "tiny-cpu", *overrides(tiny, one, *opts)])
    assert r.returncode == 0, r.stderr[-3000:]
    run_script(
        ["-m", "dapo.cli", "train", "--config", "tiny-cpu", "--quiet", *overrides(tiny, two, *opts)],
        nproc=2,
        timeout_s=600,
        dist_timeout_s=120,
    )
    skip = ("sync/", "async/", "sampling/rank_token_imbalance")
    for x, y in zip(metrics(one), metrics(two)):
        assert_same(
            {k: v for k, v in comparable(x).items() if not k.startswith(skip)},
            {k: v for k, v in comparable(y).items() if not k.startswith(skip)},
            tol=1e-4,
        )


SELECTION = (
    "rollout.engine=hf",
    "eval.every=0",
    "algo.prompt_selection=greso",
    "train.steps=5",
)


def test_prompt_selection_resumes_exactly(tiny, tmp_path):
    """algo.prompt_selection=greso: prompts are skipped before generation (sampling/* says how
    many and why); a run stopped after step 2 and resumed logs the uninterrupted run's metrics,
    selection included (the history is in the checkpoint); another policy cannot continue it.
    On several processes (every rank the same history at every checkpoint, resumed on fewer and
    on more processes): the rehearsal's main runs (scale/rehearsal/run.py, in CI)."""
    one, cut = tmp_path / "one", tmp_path / "cut"
    base = ["train", "--config", "tiny-cpu"]
    r = run_cli(base + overrides(tiny, one, *SELECTION))
    assert r.returncode == 0, r.stderr[-3000:]
    full = metrics(one)
    assert sum(m["sampling/skipped_prompts"] for m in full) > 0
    for m in full:
        assert m["sampling/offered_prompts"] == (
            m["sampling/generated_groups"] + m["sampling/skipped_prompts"] - m["sampling/forced_prompts"]
        )
        assert 0 < m["sampling/selection_p_easy"] < 1 and 0 < m["sampling/selection_p_hard"] < 1
    assert run_cli(base + overrides(tiny, cut, *SELECTION) + ["--steps", "2"]).returncode == 0
    r = run_cli(base + overrides(tiny, cut, *SELECTION) + ["--resume", "auto"])
    assert r.returncode == 0, r.stderr[-3000:]
    for x, y in zip(full, metrics(cut), strict=True):
        assert_same(comparable(x), comparable(y))
    # another policy cannot continue this history: one line, exit 2
    r = run_cli(
        base
        + overrides(tiny, cut, *SELECTION, "algo.prompt_selection=retire", "train.steps=6")
        + ["--resume", "auto"]
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "prompt selection is 'greso', this run's 'retire'" in r.stderr and "Traceback" not in r.stderr


# ---- a user's loss, named in the config, in both placements ------------------------------------

COUNTED_LOSS = '''
import os

from dapo.loss import policy_loss


def counted(logp, old_logp, advantages, mask, clip, *, is_weights=None):
    """DAPO's loss, each call written down (pid, rows) to $COUNTED_LOSS_LOG."""
    with open(os.environ["COUNTED_LOSS_LOG"], "a") as f:
        f.write(f"{os.getpid()} {logp.shape[0]}\\n")
    return policy_loss(logp, old_logp, advantages, mask, clip, is_weights=is_weights)
'''


def test_a_users_loss_named_in_the_config_is_the_one_trained_in_both_placements(tiny, tmp_path):
    """``algo.policy_loss=module:function``: the learner calls the user's function (every call
    written down by the learner's process, none by a generator's), the colocated and the
    disaggregated placement train the same steps with it (staleness 0: every metric to 1e-6),
    and the run's config, its gate record and its start line name the loss."""
    (tmp_path / "counted_loss.py").write_text(COUNTED_LOSS)
    colo, dis = tmp_path / "colo", tmp_path / "dis"
    base = ["train", "--config", "tiny-cpu", "algo.policy_loss=counted_loss:counted"]
    runs = {}
    for out, extra in ((colo, ("rollout.engine=hf", "eval.every=0")), (dis, DISAGG)):
        log = tmp_path / f"{out.name}.calls"
        env = {"COUNTED_LOSS_LOG": str(log), "PYTHONPATH": str(tmp_path)}
        r = run_cli(base + overrides(tiny, out, *extra), env_extra=env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "policy loss counted_loss:counted" in r.stderr.splitlines()[0]
        calls = [line.split() for line in log.read_text().splitlines()]
        assert calls and all(int(rows) > 0 for _, rows in calls)
        assert {pid for pid, _ in calls}.isdisjoint(str(p) for p in _generator_pids(out))
        assert json.loads((out / "config.json").read_text())["algo"]["policy_loss"] == "counted_loss:counted"
        assert json.loads((out / "gate.json").read_text())["policy_loss"] == "counted_loss:counted"
        runs[out.name] = metrics(out)
        steps = sum(m["actor/optimizer_steps"] for m in runs[out.name])
        assert steps > 0 and len(calls) >= steps  # at least one micro-batch per optimizer step
    drop = ("sync/", "async/")
    for x, y in zip(runs["colo"], runs["dis"], strict=True):
        assert_same(
            {k: v for k, v in comparable(x).items() if not k.startswith(drop)},
            {k: v for k, v in comparable(y).items() if not k.startswith(drop)},
        )


def test_a_loss_that_cannot_run_is_refused_before_anything_is_built(tiny, tmp_path):
    """One line naming algo.policy_loss, exit 2, no run directory: an unknown module, a loss that
    cannot take the importance weights tiny-cpu's tis_cap sends, and one that raises at the
    first step (after which resuming is the way on)."""
    (tmp_path / "no_weights.py").write_text(
        "from dapo.loss import policy_loss\n\n"
        "def plain(logp, old_logp, advantages, mask, clip):\n"
        "    return policy_loss(logp, old_logp, advantages, mask, clip)\n\n"
        "def raises(logp, old_logp, advantages, mask, clip, *, is_weights=None):\n"
        "    raise RuntimeError('my bug')\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    for spec, words in (
        ("no_such_module:f", "cannot import module 'no_such_module'"),
        ("no_weights:plain", "takes no is_weights keyword"),
    ):
        out = tmp_path / spec.replace(":", "_")
        r = run_cli(
            ["train", "--config", "tiny-cpu", f"algo.policy_loss={spec}", *overrides(tiny, out)],
            env_extra=env,
        )
        assert r.returncode == 2 and "algo.policy_loss" in r.stderr and words in r.stderr, r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    out = tmp_path / "raises"
    raising = ["algo.policy_loss=no_weights:raises", "rollout.engine=hf", "eval.every=0"]
    r = run_cli(
        ["train", "--config", "tiny-cpu", *raising, *overrides(tiny, out)],
        env_extra=env,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "loss 'no_weights:raises' raised: RuntimeError: my bug" in last and "--resume auto" in last
    assert "Traceback" not in r.stderr
