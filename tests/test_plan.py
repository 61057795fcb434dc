import json
from pathlib import Path

import pytest
from scale_support import need

need("yaml")

from scale.config import load  # noqa: E402
from scale.ops.fit import KNOWN, Arch, arch_for  # noqa: E402
from scale.ops.plan import Cluster, GiB, Strategy, plan  # noqa: E402


def test_parameter_counts_match_the_published_sizes():
    # Qwen2.5 model cards: 0.49B, 1.54B, 3.09B, 7.61B, 14.7B, 32.5B, 72.7B parameters
    expected = {
        "0.5B": 0.49e9,
        "1.5B": 1.54e9,
        "3B": 3.09e9,
        "7B": 7.61e9,
        "14B": 14.7e9,
        "32B": 32.5e9,
        "72B": 72.7e9,
    }
    for name, n in expected.items():
        assert KNOWN[f"Qwen/Qwen2.5-{name}"].params() == pytest.approx(n, rel=0.015), name


def test_small_case_by_hand(tmp_path):
    # hidden 8, 1 layer, 2 heads (head_dim 4), 1 kv head, intermediate 16, vocab 10, untied
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "intermediate_size": 16,
                "vocab_size": 10,
                "tie_word_embeddings": False,
            }
        )
    )
    a = arch_for(str(tmp_path))
    # q 64+8, k 32+4, v 32+4, o 64, mlp 3*8*16=384, norms 16 -> 608 per layer
    assert a.layer_params() == 608
    assert a.params() == 2 * 80 + 608 + 8
    assert a.kv_bytes_per_token() == 2 * 1 * 1 * 4 * 2
    cfg = load(
        "tiny-cpu",
        [
            f"model.path={tmp_path}",
            "rollout.tensor_parallel=1",
            "rollout.gpu_memory_utilization=0.5",
            "algo.expected_len=12",
            "algo.cache_len=4",
            "model.logprob_chunk=2",
        ],
    )
    pl = plan(
        cfg,
        Cluster(1, 2, 1.0, overhead_gib=0.0),
        Strategy(param_offload=False, optimizer_offload=False, micro_batch_tokens=10, prompt_tokens=4),
    )
    p = a.params()
    per = {k: v * GiB for k, v in pl.per_gpu_gib.items()}
    assert per["fp32 parameters (sharded)"] == pytest.approx(4 * p / 2)
    assert per["AdamW moments (sharded)"] == pytest.approx(8 * p / 2)
    assert per["checkpointed activations"] == pytest.approx(10 * 8 * 2 * 1)
    assert per["one layer's activations"] == pytest.approx(10 * 34 * 8)
    assert per["log-prob chunk buffers"] == pytest.approx(3 * 2 * 10 * 4)
    assert per["vLLM weights (TP shard)"] == pytest.approx(2 * p)
    assert per["vLLM KV cache (reserved)"] == pytest.approx(0.5 * GiB - 2 * p)
    assert pl.engine_concurrency == int((0.5 * GiB - 2 * p) // (16 * 20))  # 20 tokens at the ceiling
    assert pl.fits


def test_paper_setup_fits_on_16_nodes_and_not_on_one_node_without_offload():
    cfg = load("qwen2.5-32b-dapo")
    big = plan(cfg, Cluster(16, 8, 80.0), Strategy(param_offload=True, optimizer_offload=True))
    assert big.fits, big.problems
    assert 30e9 < big.params < 34e9
    assert big.train_phase_gib < 80 and big.generation_phase_gib < 80
    small = plan(cfg, Cluster(1, 8, 80.0), Strategy(param_offload=False, optimizer_offload=False))
    assert not small.fits
    assert any("offload" in a for a in small.advice)


def test_dynamic_sampling_costs_extra_generation():
    cfg = load("qwen2.5-32b-dapo", ["rollout.gen_groups=512"])
    full = plan(cfg, Cluster(16, 8, 80.0), Strategy(acceptance=1.0))
    half = plan(cfg, Cluster(16, 8, 80.0), Strategy(acceptance=0.25))
    assert half.step_seconds["generation_rounds"] == 4 and full.step_seconds["generation_rounds"] == 1
    assert half.step_seconds["generation"] == pytest.approx(4 * full.step_seconds["generation"])


def test_cli(capsys):
    from scale.ops.plan import main

    assert main(["--config", "qwen2.5-32b-dapo", "--gpus", "8", "--gpu-mem", "80", "--nodes", "16"]) == 0
    out = capsys.readouterr().out
    assert "FITS" in out and "policy loss dapo" in out.splitlines()[0]  # the loss the plan is for
    assert main(["--config", "qwen2.5-32b-dapo", "--gpus", "8", "--gpu-mem", "80", "--no-offload"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "what to change" in out
    assert main(["--config", "qwen2.5-32b-dapo", "--gpus", "6", "--gpu-mem", "80"]) == 2  # 6 % TP 4
    with pytest.raises(ValueError):
        arch_for("no/such-model")
    assert isinstance(Arch(8, 1, 2, 1, 16, 10, True).head_dim, int)


def test_the_plan_follows_the_configs_offload(capsys):
    """Issue 47, finding 7: the planner assumed offload whatever the config said, so a colocated
    run with train.fsdp_offload: false (the 7B preset) was planned with no trainer state on the
    GPU. Planned as the trainer will run it, that state is resident beside the awake engine, and
    at the issue's 80% engine reservation it does not fit, with the fix named."""
    from scale.ops.plan import main

    base = ["--config", "qwen2.5-math-7b-dapo", "--gpus", "8", "--gpu-type", "a100-80gb"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "param_offload=False" in out and "FITS" in out
    resident = {
        line.split("  ")[1].strip(): float(line.split()[-1])
        for line in out.splitlines()
        if line.startswith("  fp32 parameters") or line.startswith("  AdamW moments")
    }
    assert resident == {
        "fp32 parameters (sharded)": pytest.approx(3.55, abs=0.01),
        "AdamW moments (sharded)": pytest.approx(7.09, abs=0.01),
    }
    assert main([*base, "rollout.gpu_memory_utilization=0.8"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "generation phase needs" in out and "train.fsdp_offload=true" in out
    assert main([*base, "rollout.gpu_memory_utilization=0.8", "train.fsdp_offload=true"]) == 0
    assert "param_offload=True" in capsys.readouterr().out


def test_placement_estimate_orders_and_depends_on_the_tail():
    """The planner's placements on the same GPUs: disaggregated k = 0 never beats colocated
    (both phases on fewer GPUs, no overlap), more staleness never slows the pipeline, and only
    where the longest response bounds the round (decoding slower per sequence than the GPUs'
    share) does splitting the GPUs pay; the assumptions are printed."""
    from scale.ops.plan import format_placement, placement

    cfg = load("qwen2.5-32b-dapo")
    cluster = Cluster(16, 8, 80.0)
    pl = plan(cfg, cluster)
    p = placement(pl, cfg, cluster)
    rate = {name: r for name, _, _, r in p.rows}
    colo, k0, k1, k2 = (
        rate[n] for n in ["colocated, synchronous"] + [f"disaggregated, k = {k}" for k in (0, 1, 2)]
    )
    assert k0 <= colo and k0 <= k1 <= k2
    assert all(g % 4 == 0 for _, g, _, _ in p.rows)  # whole engines (tensor_parallel 4)
    tail = Cluster(16, 8, 80.0, decode_tokens_per_s_per_seq=10.0)  # a 20k-token response: 34 min
    p2 = placement(plan(cfg, tail), cfg, tail)
    rate2 = {name: r for name, _, _, r in p2.rows}
    assert rate2["disaggregated, k = 2"] > 1.2 * rate2["colocated, synchronous"]
    text = format_placement(p)
    assert "generation_cv=0.3" in text and "weights_broadcast_gbps=25.0" in text and "(1.00x)" in text
    with pytest.raises(ValueError, match="multiple of tensor_parallel"):
        placement(pl, cfg, cluster, gen_gpus=6)
    fixed = placement(pl, cfg, cluster, gen_gpus=64)
    assert fixed.rows[1][1:3] == (64, 64)


VARIANT = [
    "rollout.mode=disaggregated",
    "rollout.generators=24",
    "rollout.generator_nodes=12",
    "rollout.max_staleness=1",
    "eval.every=0",
]
"""The 32B preset's disaggregated variant on 16 nodes (docs/presets.md)."""


def test_generator_nodes_are_planned_as_whole_nodes_with_the_weights_over_the_network(capsys):
    """rollout.generator_nodes: the config's split (its generators' GPUs generate, the other
    nodes' GPUs train), the broadcast timed at --network-gbps (half the bandwidth, twice the
    time; the rates can only fall), the learners' state sharded over their own nodes only, and
    a generator node's host memory its own generators' versions."""
    from scale.ops.fit import generator_node_bytes, host_bytes
    from scale.ops.plan import format_placement, main, placement

    cfg = load("qwen2.5-32b-dapo", VARIANT)
    cluster = Cluster(16, 8, 80.0)
    pl = plan(cfg, cluster)
    fast, slow = placement(pl, cfg, cluster), placement(pl, cfg, cluster, network_gbps=12.5)
    assert [r[1:3] for r in fast.rows[1:]] == [(96, 32)] * 3  # 24 generators x TP 4; 4 nodes x 8 train
    assert slow.assumptions["weights_broadcast_s"] == pytest.approx(
        2 * fast.assumptions["weights_broadcast_s"], abs=0.1
    )
    assert all(s[3] <= f[3] for s, f in zip(slow.rows[1:], fast.rows[1:])) and slow.rows[0] == fast.rows[0]
    assert "4 learner node(s), 12 generator node(s)" in format_placement(fast)
    local = load("qwen2.5-32b-dapo", [*VARIANT[:2], "rollout.generator_nodes=0", *VARIANT[3:]])
    learners = host_bytes(cfg, pl.params, nodes=16, gpus_per_node=8)
    assert learners["offloaded trainer state"] == pytest.approx(16 * pl.params / 4)
    assert not any("generators" in k for k in learners)
    assert generator_node_bytes(cfg, pl.params) == pytest.approx(generator_node_bytes(local, pl.params) / 12)
    with pytest.raises(ValueError, match="leaves no node of --nodes 12"):
        placement(pl, cfg, Cluster(12, 8, 80.0))
    args = ["--config", "qwen2.5-32b-dapo", "--gpus", "8", "--gpu-type", "h100-80gb", *VARIANT]
    assert main([*args, "--nodes", "12"]) == 2
    assert capsys.readouterr().err.strip() == (
        "dapo plan: rollout.generator_nodes=12 leaves no node of --nodes 12 to train on"
    )
    assert main([*args, "--nodes", "16"]) == 0
    out = capsys.readouterr().out
    assert "host memory per generator node (GiB): 1,465" in out and "FITS" in out


def test_delta_sync_plans_the_measured_bytes_and_the_learners_copy():
    """rollout.delta_sync: each version's broadcast takes the measured share of the whole
    model's time (the constant is the committed benchmark's largest share at the presets' lr),
    and rank 0's node holds one more copy of the model in the engine's dtype."""
    from dataclasses import replace

    from scale.ops.fit import host_bytes
    from scale.ops.plan import DELTA_SENT_SHARE, placement

    bench = json.loads(
        (Path(__file__).resolve().parents[1] / "benchmarks/results/delta_sync.json").read_text()
    )
    assert DELTA_SENT_SHARE == round(max(x["sent_share"] for x in bench["by_lr"]["1e-06"]), 3)
    cfg = load("qwen2.5-32b-dapo", ["rollout.mode=disaggregated", "eval.every=0"])
    on = replace(cfg, rollout=replace(cfg.rollout, delta_sync=True))
    cluster = Cluster(16, 8, 80.0)
    pl = plan(cfg, cluster)
    whole, sparse = placement(pl, cfg, cluster).assumptions, placement(pl, on, cluster).assumptions
    assert sparse["weights_broadcast_s"] == pytest.approx(
        whole["weights_broadcast_s"] * DELTA_SENT_SHARE, abs=0.1
    )
    assert sparse["delta_sync_sent_share"] == DELTA_SENT_SHARE and "delta_sync_sent_share" not in whole
    extra = set(host_bytes(on, pl.params, nodes=16, gpus_per_node=8)) - set(
        host_bytes(cfg, pl.params, nodes=16, gpus_per_node=8)
    )
    assert extra == {"the version sent last (rollout.delta_sync)"}
    assert host_bytes(on, pl.params, nodes=16, gpus_per_node=8)[extra.pop()] == 2 * pl.params


def test_selection_saving_counts_the_rounds_a_higher_acceptance_removes(capsys):
    """--selection-acceptance: the generation time at the rate measured with prompt selection
    against --acceptance, the rest of the plan equal; whole rounds, as the trainer generates."""
    import json

    from scale.ops.plan import main, selection_saving

    cfg = load("qwen2.5-32b-dapo", [])
    cluster = Cluster(16, 8, 80.0)
    s = selection_saving(cfg, cluster, Strategy(acceptance=0.15), 0.25)
    assert (s["rounds_without"], s["rounds_with"]) == (3, 2)
    assert s["generation_saved_s"] == pytest.approx(s["generation_s_without"] / 3)
    assert 0 < s["step_saved_fraction"] < 1
    same = selection_saving(cfg, cluster, Strategy(acceptance=0.233), 0.299)  # the toy's rates
    assert same["rounds_without"] == same["rounds_with"] == 2 and same["generation_saved_s"] == 0
    worse = selection_saving(cfg, cluster, Strategy(acceptance=0.5), 0.2)
    assert worse["generation_saved_s"] < 0  # a selection that lowers acceptance costs time
    with pytest.raises(ValueError, match="selection-acceptance"):
        selection_saving(cfg, cluster, Strategy(), 0.0)
    args = ["--config", "qwen2.5-32b-dapo", "--gpus", "8", "--gpu-mem", "80", "--nodes", "16"]
    assert main([*args, "--acceptance", "0.15", "--selection-acceptance", "0.25"]) == 0
    assert "prompt selection: acceptance 0.15 -> 0.25: 3 -> 2 generation round(s)" in capsys.readouterr().out
    assert main([*args, "--selection-acceptance", "0.25", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["selection"]["acceptance_with"] == 0.25
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["selection"] is None


DISAGGREGATED = [
    "rollout.mode=disaggregated",
    "rollout.generators=2",
    "eval.every=0",
    "algo.train_groups=6",
    "algo.mini_batch_groups=6",
    "rollout.gen_groups=6",
    "rollout.tensor_parallel=1",
]


def test_a_generator_s_engine_is_sized_by_its_weights_and_one_sequence_s_kv_cache():
    """Qwen2.5-32B: 64 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 B = 256 KiB per token, so
    a 20,480-token response holds 5 GiB; bf16 weights 2 B per parameter. At TP 1 on an 80 GB
    GPU at 0.8 they need 67 GiB of 63.4: refused, with the term named; at TP 2, on an H200, or
    at utilization 0.9 the same engine fits."""
    from scale.ops.fit import GPUS, engine_gib, problems, smallest_tp

    cfg = load("qwen2.5-32b-dapo", DISAGGREGATED)
    g = engine_gib(cfg)
    assert g["kv_one_sequence"] == pytest.approx(20480 * 64 * 8 * 128 * 2 * 2 / GiB)
    assert g["weights"] == pytest.approx(2 * KNOWN["Qwen/Qwen2.5-32B"].params() / GiB)
    (line,) = problems(cfg, GPUS["h100-80gb"])
    assert "KV cache (5.0 GiB)" in line and "63.4 GiB" in line and "rollout.tensor_parallel=2 fits" in line
    assert smallest_tp(cfg, GPUS["h100-80gb"].memory_gib) == 2
    assert problems(cfg, GPUS["h200"]) == []
    assert (
        problems(
            load("qwen2.5-32b-dapo", [*DISAGGREGATED, "rollout.gpu_memory_utilization=0.9"]),
            GPUS["h100-80gb"],
        )
        == []
    )
    # the colocated preset (TP 4) fits even a 40 GB A100's engine share; at TP 1 it would not
    assert problems(load("qwen2.5-32b-dapo"), GPUS["a100-40gb"]) == []
    (tp1,) = problems(load("qwen2.5-32b-dapo", ["rollout.tensor_parallel=1"]), GPUS["a100-40gb"])
    assert "weights (61.0 GiB per GPU) exceed" in tp1 and "rollout.tensor_parallel=4 fits" in tp1


def test_plan_and_validate_only_refuse_what_cannot_fit_before_any_model_loads(capsys, tmp_path):
    from scale.ops.cli import train_main
    from scale.ops.plan import main

    argv = ["--config", "qwen2.5-32b-dapo", "--gpus", "8", "--gpu-type", "h100-80gb", *DISAGGREGATED]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "generator(s) on H100 80GB" in out
    assert "versions held by the generators (rank 0's node)" in out and "checkpoints: 393 GB each" in out
    assert main([*argv, "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    held = got["host_memory_per_node_gib"]["versions held by the generators (rank 0's node)"]
    k = load("qwen2.5-32b-dapo", DISAGGREGATED).rollout.max_staleness
    assert held == pytest.approx(2 * (k + 2) * 2 * KNOWN["Qwen/Qwen2.5-32B"].params() / GiB)  # 2 generators
    assert got["checkpoints_kept_gb"] == pytest.approx(3 * got["checkpoint_gb"])
    # the batches in flight are part of each checkpoint (issue 71: they were not counted)
    assert k == 0 and got["in_flight_gb"] == 0 and "in flight" not in out
    assert main([*argv, "rollout.max_staleness=2"]) == 1
    assert "+ 2 batch(es) in flight" in capsys.readouterr().out
    assert main([*argv, "rollout.max_staleness=2", "--json"]) == 1
    two = json.loads(capsys.readouterr().out)
    params = KNOWN["Qwen/Qwen2.5-32B"].params()
    assert two["in_flight_gb"] > 0 and two["checkpoint_gb"] == pytest.approx(
        12 * params / 1e9 + two["in_flight_gb"]
    )
    # host memory: a node with too little is refused by its term
    assert main([*argv[:-7], "--nodes", "16", "--host-mem", "100"]) == 1
    assert "host memory: " in capsys.readouterr().out
    assert (
        train_main(
            ["--config", "qwen2.5-32b-dapo", "--validate-only", "--gpu-type", "h100-80gb", *DISAGGREGATED]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("dapo train: does not fit: each of rollout.generators=2") and err.count("\n") == 1
    # at the TP the line names, the engine terms fit
    tp2 = [*DISAGGREGATED[:-1], "rollout.tensor_parallel=2"]
    main(["--config", "qwen2.5-32b-dapo", "--gpus", "8", "--gpu-type", "h100-80gb", *tp2])
    assert "generator(s) on H100 80GB" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--config", "qwen2.5-32b-dapo", "--gpus", "8", "--gpu-type", "b999"])
    assert "--gpu-type" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name,gpus,nodes,gpu,offload",
    [
        ("qwen2.5-math-1.5b-dapo", 1, 1, "h100-80gb", False),
        ("qwen2.5-math-1.5b-dapo", 1, 1, "a100-80gb", False),
        ("qwen2.5-math-7b-dapo", 8, 1, "h100-80gb", False),
        ("qwen2.5-math-7b-dapo", 8, 1, "a100-80gb", False),
        ("qwen2.5-32b-dapo", 8, 16, "h100-80gb", True),
    ],
)
def test_each_rung_fits_its_gpus_and_the_plan_gives_its_hours(capsys, name, gpus, nodes, gpu, offload):
    """The presets that climb (one GPU, one node, 16 nodes) fit the named GPU types they are
    written for, and `dapo plan` prints the whole run's wall clock and GPU-hours."""
    from scale.ops.fit import GPUS, problems
    from scale.ops.plan import main

    cfg = load(name)
    assert cfg.train.fsdp_offload == offload
    assert problems(cfg, GPUS[gpu]) == []  # what `dapo train --validate-only --gpu-type` checks
    argv = ["--config", name, "--gpus", str(gpus), "--nodes", str(nodes), "--gpu-type", gpu]
    argv += [] if offload else ["--no-offload"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "FITS" in text and f"run (train.steps={cfg.train.steps}): " in text and "GPU-hours" in text
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    run = got["run"]
    assert run["hours"] == pytest.approx(cfg.train.steps * got["step_seconds"]["total"] / 3600)
    assert run["gpu_hours"] == pytest.approx(run["hours"] * gpus * nodes)
    assert got["assumptions"]["gpu_tflops"] == GPUS[gpu].tflops  # the type's own peak by default
    if gpus * nodes == cfg.rollout.tensor_parallel:  # one engine's GPUs: colocated is the only placement
        assert [r[0] for r in got["placement"]["rows"]] == ["colocated, synchronous"]


def test_a_lora_policy_plans_gradients_and_adamw_for_its_adapters_only():
    """model.lora: the frozen base keeps its fp32 copy, but gradients and AdamW moments are the
    adapters' (rank x (in + out) per adapted projection, every layer), so 7B fits one GPU."""
    from scale.ops.fit import GPUS

    cluster = Cluster(1, 1, GPUS["h100-80gb"].memory_gib)
    no_offload = Strategy(param_offload=False, optimizer_offload=False)
    a = KNOWN["Qwen/Qwen2.5-Math-7B"]
    ONE = ["train.sharding=none", "rollout.tensor_parallel=1"]
    full = plan(load("qwen2.5-math-7b-dapo", ONE), cluster, no_offload)
    lora = plan(load("qwen2.5-math-7b-dapo", [*ONE, "model.lora.rank=32"]), cluster, no_offload)
    h, kv, i = a.hidden, a.kv_heads * a.head_dim, a.intermediate
    want = a.layers * 32 * ((h + h) * 2 + (h + kv) * 2 + (h + i) * 2 + (i + h))
    assert lora.assumptions["trained_parameters"] == want < a.params() / 50
    assert lora.per_gpu_gib["AdamW moments (sharded)"] == pytest.approx(8 * want / GiB)
    assert full.per_gpu_gib["AdamW moments (sharded)"] == pytest.approx(8 * a.params() / GiB)
    assert not full.fits and lora.train_phase_gib < full.train_phase_gib - 80


def test_the_plans_in_flight_bytes_are_what_a_checkpoint_stores():
    """fit.in_flight_bytes against the bytes batch_state's archive takes for batches at full
    length (every response at algo.max_len, every prompt at data.max_prompt_tokens), k of
    them: within 2% at this small shape (torch.save's framing, ~4 KB an archive, is the rest;
    nothing at a real batch's gigabytes)."""
    import torch

    from dapo import RolloutBatch
    from scale.dist.bridge import dump
    from scale.generator.rollout import batch_state
    from scale.ops.fit import in_flight_bytes

    cfg = load(
        "tiny-cpu",
        [
            "rollout.mode=disaggregated",
            "rollout.max_staleness=2",
            "eval.every=0",
            "algo.train_groups=8",
            "algo.mini_batch_groups=8",
            "algo.group_size=4",
            "algo.expected_len=384",
            "algo.cache_len=128",
            "data.max_prompt_tokens=64",
        ],
    )
    a = cfg.algo
    b, t, p = a.train_groups * a.group_size, a.max_len, cfg.data.max_prompt_tokens
    batch = RolloutBatch(
        old_logp=torch.zeros(b, t),
        rollout_logp=torch.zeros(b, t),
        mask=torch.ones(b, t, dtype=torch.bool),
        lengths=torch.full((b,), t),
        truncated=torch.zeros(b, dtype=torch.bool),
        correct=torch.zeros(b, dtype=torch.bool),
        rewards=torch.zeros(b),
        group_ids=torch.arange(a.train_groups).repeat_interleave(a.group_size),
        group_size=a.group_size,
        extras={
            "prompt_ids": torch.zeros(b, p, dtype=torch.long),
            "prompt_len": torch.full((b,), p),
            "response_ids": torch.zeros(b, t, dtype=torch.long),
            "version": torch.zeros(b, t, dtype=torch.int32),
        },
    )
    stored = cfg.rollout.max_staleness * len(dump(batch_state(batch)))
    assert in_flight_bytes(cfg) == pytest.approx(stored, rel=0.02)
    assert in_flight_bytes(cfg) < stored  # the tensors' own bytes: the framing comes on top
    assert in_flight_bytes(load("tiny-cpu")) == 0.0  # colocated: nothing in flight


def test_the_presets_page_quotes_what_dapo_plan_prints(capsys):
    """docs/how-to/presets.md's table gives, per preset, the step time, steps, hours and GPU-hours
    `dapo plan` prints on H100s (the 32B preset's steps are rollout steps: the paper's ~330)."""
    from scale.ops.plan import main

    page = (Path(__file__).parents[1] / "docs" / "how-to" / "presets.md").read_text()
    rows = {
        "qwen2.5-math-1.5b-dapo": (1, 1, False),
        "qwen2.5-math-7b-dapo": (8, 1, False),
        "qwen2.5-32b-dapo": (8, 16, True),
    }
    for name, (gpus, nodes, offload) in rows.items():
        argv = [
            "--config",
            name,
            "--gpus",
            str(gpus),
            "--nodes",
            str(nodes),
            "--gpu-type",
            "h100-80gb",
            "--json",
        ]
        assert main(argv + ([] if offload else ["--no-offload"])) == 0
        got = json.loads(capsys.readouterr().out)
        steps = load(name).train.steps
        said = (
            f"{got['step_seconds']['total']:,.0f} s a step, {steps:,} steps: {got['run']['hours']:,.0f} h, "
            f"{got['run']['gpu_hours']:,.0f} GPU-hours"
        )
        row = next(
            line for line in page.splitlines() if line.startswith(f"| `{name}` |") and " s a step" in line
        )
        assert said in row, (said, row)
