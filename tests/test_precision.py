"""Precision of the trainer: fp32 master weights with bf16 compute move the weights at the
paper's learning rate (1e-6) the way fp32 training does; bf16 weights do not."""

import pytest
import torch
from scale_support import need

need("transformers")

STEPS = 20
LR = 1e-6


def train(path, *, weights: torch.dtype, autocast: bool):
    """20 AdamW steps at lr 1e-6 on a fixed objective; the weights before and after (fp32)."""
    from transformers import AutoModelForCausalLM

    from scale.learner.policy import Policy

    lm = AutoModelForCausalLM.from_pretrained(path, dtype=weights)
    policy = Policy(lm, chunk=16)
    before = {k: v.detach().float().clone() for k, v in lm.state_dict().items()}
    opt = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 24, (4, 6), generator=g)
    response = torch.randint(3, 24, (4, 10), generator=g)
    for _ in range(STEPS):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, _ = policy(prompt, torch.full((4,), 6), response, pad_id=1)
        (-logp.float().mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    after = {k: v.detach().float() for k, v in lm.state_dict().items()}
    return before, after


def moved_fraction(before, after):
    n = sum(v.numel() for v in before.values())
    return sum(int((after[k] != before[k]).sum()) for k in before) / n


def delta(before, after):
    return torch.cat([(after[k] - before[k]).flatten() for k in sorted(before)])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from scale.ops.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("prec") / "m", format_steps=0)


def test_fp32_masters_with_bf16_compute_move_like_fp32_and_bf16_weights_do_not(model):
    ref = train(model, weights=torch.float32, autocast=False)
    mixed = train(model, weights=torch.float32, autocast=True)
    low = train(model, weights=torch.bfloat16, autocast=False)
    f_ref, f_mixed, f_low = moved_fraction(*ref), moved_fraction(*mixed), moved_fraction(*low)
    assert f_ref > 0.99 and f_mixed > 0.99, (f_ref, f_mixed)
    assert f_low < 0.25, f_low  # bf16 cannot hold a 1e-6 step on most weights
    d_ref, d_mixed = delta(*ref), delta(*mixed)
    cos = float(torch.nn.functional.cosine_similarity(d_ref, d_mixed, dim=0))
    assert cos > 0.9, cos  # the same direction: bf16 compute adds noise, not bias
    ratio = float(d_mixed.norm() / d_ref.norm())
    assert 0.8 < ratio < 1.25, ratio


def test_a_parameter_left_on_meta_is_refused():
    from scale.learner.sharding import check_materialised

    lin = torch.nn.Linear(2, 2)
    check_materialised(lin)
    with torch.device("meta"):
        ghost = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="weight is still on the meta device"):
        check_materialised(ghost)
