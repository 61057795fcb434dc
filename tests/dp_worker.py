"""Run one DAPO update of the scale trainer's path on a fixed batch, on 1 or N processes
(launched with torchrun). Rank r takes groups [r*k, (r+1)*k); the single-process run is
given the groups in the order N ranks interleave them into windows, so both must produce
the same weights and the same metrics (written per rank to OUT_FILE.rank<r>.json).

Usage: dp_worker.py MODEL_DIR OUT_FILE [--order 0,2,1,3] [--sharding none|fsdp2]
[--max-tokens N] (token-budget micro-batches, packed) [--offload] [--lora RANK] (FSDP2: LoRA
adapters; the state saved is PEFT's, the stream the merged weights)"""

import argparse
import json
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from multiproc import worker
from transformers import AutoModelForCausalLM

from dapo import AlgoConfig, RolloutBatch
from scale.config import load
from scale.dist.topology import dist_timeout
from scale.learner.policy import Policy
from scale.learner.role import run_update
from scale.learner.sharding import build_policy
from scale.learner.sync import stream_weights

G, GROUPS, T, P = 2, 4, 5, 3


def batch(pad_id: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    b = G * GROUPS
    lengths = torch.randint(1, T + 1, (b,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    response = torch.where(mask, torch.randint(3, 20, (b, T), generator=g), torch.full((b, T), pad_id))
    prompt_len = torch.randint(1, P + 1, (b,), generator=g)
    prompt = torch.where(
        torch.arange(P).unsqueeze(0) < prompt_len.unsqueeze(1),
        torch.randint(3, 20, (b, P), generator=g),
        torch.full((b, P), pad_id),
    )
    correct = torch.tensor([True, False, True, True, False, False, True, False])
    rollout = torch.where(mask, -torch.rand(b, T, generator=g), torch.zeros(b, T))
    return RolloutBatch(
        old_logp=rollout.clone(),
        rollout_logp=rollout,
        mask=mask,
        lengths=lengths,
        truncated=lengths == T,
        correct=correct,
        rewards=torch.where(correct, 1.0, -1.0),
        group_ids=torch.arange(GROUPS).repeat_interleave(G),
        group_size=G,
        extras={"prompt_ids": prompt, "prompt_len": prompt_len, "response_ids": response},
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--order", default=None)
    ap.add_argument("--sharding", default="none")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--offload", action="store_true", help="train.fsdp_offload (FSDP2 CPUOffloadPolicy)")
    ap.add_argument("--lora", type=int, default=0, help="model.lora.rank (FSDP2 only)")
    args = ap.parse_args()
    # a dead peer ends the run with an error within seconds instead of gloo's 30-minute wait
    acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=dist_timeout(60))])
    torch.manual_seed(0)
    if args.sharding == "none":
        lm = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
        policy = Policy(lm, chunk=7)
        # SGD: Adam divides by sqrt(v) and turns float32 summation-order noise on near-zero
        # gradients into visible weight differences; the property under test is the gradient.
        opt = torch.optim.SGD(policy.parameters(), lr=0.5)
        policy, opt = acc.prepare(policy, opt)
    else:  # the trainer's own FSDP2 path: rank 0 reads the weights, the others get shards
        overrides = [f"model.path={args.model_dir}", "model.logprob_chunk=7"]
        overrides += ["train.fsdp_offload=true"] if args.offload else []
        overrides += [f"model.lora.rank={args.lora}"] if args.lora else []
        cfg = load("tiny-cpu-fsdp", overrides)
        policy = build_policy(cfg, acc)[0]
        opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.5)
    full = batch(pad_id=1)
    algo = AlgoConfig(
        group_size=G,
        train_groups=GROUPS,
        mini_batch_groups=2,
        expected_len=4,
        cache_len=1,
        max_grad_norm=1.0,
        tis_cap=2.0,
    )
    world, rank = acc.num_processes, acc.process_index
    if world == 1:
        order = [int(x) for x in args.order.split(",")] if args.order else list(range(GROUPS))
        rows = torch.tensor([g * G + i for g in order for i in range(G)])
        mine = full.select(rows, group_size=G)
    else:
        k = GROUPS // world
        mine = full.select(torch.arange(rank * k * G, (rank + 1) * k * G), group_size=G)
    m = run_update(
        acc,
        policy,
        opt,
        algo,
        mine,
        micro_batch_size=3,
        pad_id=1,
        max_tokens=args.max_tokens,
        sharded=args.sharding == "fsdp2" and world > 1,
    )
    assert m["actor/optimizer_steps"] == 2, m
    with open(f"{args.out}.rank{rank}.json", "w") as f:  # every rank's metrics, as logged
        json.dump(m, f)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if args.sharding == "fsdp2":  # what the weight sync streams: the full trained weights
        lm = acc.unwrap_model(policy).lm
        streamed = dict(stream_weights(lm, dtype=torch.float32, device=acc.device, bucket_bytes=1 << 16))
        if acc.is_main_process:
            torch.save({k: v.detach().clone() for k, v in streamed.items()}, f"{args.out}.stream.pt")

    state = get_model_state_dict(
        acc.unwrap_model(policy), options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if acc.is_main_process:
        torch.save({k[len("lm.") :]: v.detach().clone() for k, v in state.items()}, args.out)
    acc.end_training()
    del policy, opt, state
    acc.free_memory()  # accelerate's list of prepared models holds the DDP module, which holds the group


def checked_main() -> None:
    """``main`` under the collective-device check when ``$DAPO_CHECK_COLLECTIVES`` is set; the
    collectives it saw go to ``OUT_FILE.collectives.rank<r>.json``."""
    from scale.dist.collective_devices import CollectiveDeviceCheck, compute_device, enabled

    if not enabled():
        return main()
    check = CollectiveDeviceCheck(compute_device())
    with check:
        main()
    with open(f"{sys.argv[2]}.collectives.rank{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump(check.seen, f)


if __name__ == "__main__":
    worker(checked_main)
