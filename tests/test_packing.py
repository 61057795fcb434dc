"""The padding-free (packed) trainer forward against the padded one on the tiny Qwen2:
log-probs, entropy, the DAPO loss and every parameter's gradient; token-budget
micro-batches through dapo.update."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scale_support import need

need("transformers", "safetensors")

from dapo.batch import RolloutBatch  # noqa: E402
from dapo.config import AlgoConfig  # noqa: E402
from dapo.loss import ClipAgg, policy_loss  # noqa: E402
from dapo.update import update  # noqa: E402

PAD = 1
VOCAB = 24


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from scale.ops.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("packing") / "tiny-model")


def load(path, attn="sdpa"):
    from transformers import AutoModelForCausalLM

    from scale.learner.policy import Policy

    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
    return Policy(lm, chunk=5)


def rows(plen, rlen, seed=0, p_width=None, t_width=None):
    """Right-padded prompt and response ids for the given lengths (padding = PAD)."""
    g = torch.Generator().manual_seed(seed)
    plen, rlen = torch.tensor(plen), torch.tensor(rlen)
    p = p_width or max(1, int(plen.max()) if len(plen) else 1)
    t = t_width or max(1, int(rlen.max()) if len(rlen) else 1)
    prompt = torch.randint(3, VOCAB, (len(plen), p), generator=g)
    prompt[torch.arange(p) >= plen[:, None]] = PAD
    resp = torch.randint(3, VOCAB, (len(rlen), t), generator=g)
    resp[torch.arange(t) >= rlen[:, None]] = PAD
    return prompt, plen, resp, rlen


def mask_of(rlen, t):
    return torch.arange(t) < rlen[:, None]


# length-1 prompts and responses next to each other, 0-length responses first, middle, last
PLEN = [3, 1, 5, 2, 1, 4, 1, 6]
RLEN = [0, 1, 7, 1, 1, 0, 4, 0]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_padded_and_a_plain_forward_per_row(model_path, attn):
    pol = load(model_path, attn)
    prompt, plen, resp, rlen = rows(PLEN, RLEN, t_width=9)
    with torch.no_grad():
        lp_pad, ent_pad = pol(prompt, plen, resp, PAD)
        lp, ent = pol(prompt, plen, resp, PAD, response_len=rlen)
    m = mask_of(rlen, resp.shape[1])
    assert lp.shape == ent.shape == resp.shape
    assert torch.allclose(lp[m], lp_pad[m], atol=1e-5), (lp - lp_pad)[m].abs().max()
    assert torch.allclose(ent[m], ent_pad[m], atol=1e-5), (ent - ent_pad)[m].abs().max()
    assert torch.equal(lp[~m], torch.zeros_like(lp[~m])) and torch.equal(ent[~m], torch.zeros_like(ent[~m]))
    for row in range(len(PLEN)):  # each sequence alone, through the model's own head
        n, r = int(plen[row]), int(rlen[row])
        if r == 0:
            continue
        seq = torch.cat([prompt[row, :n], resp[row, :r]]).unsqueeze(0)
        with torch.no_grad():
            full = torch.log_softmax(pol.lm(seq).logits[0].float(), -1)
        ref = full[n - 1 : n - 1 + r].gather(-1, resp[row, :r].unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(lp[row, :r], ref, atol=1e-5), (row, lp[row, :r], ref)


def test_packed_sequences_do_not_see_each_other(model_path):
    """Changing one sequence's tokens leaves every other sequence's log-probs unchanged
    (the block-diagonal mask transformers builds from the restarting position ids)."""
    pol = load(model_path)
    prompt, plen, resp, rlen = rows([2, 1, 3], [3, 1, 2], seed=1)
    with torch.no_grad():
        a, _ = pol(prompt, plen, resp, PAD, response_len=rlen)
        prompt2, resp2 = prompt.clone(), resp.clone()
        prompt2[0, :2] = torch.tensor([7, 8])
        resp2[0, :3] = torch.tensor([9, 10, 11])
        b, _ = pol(prompt2, plen, resp2, PAD, response_len=rlen)
    assert not torch.allclose(a[0], b[0], atol=1e-4)  # the change is visible where it belongs
    assert torch.equal(a[1:], b[1:])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lens=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 6)), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_packed_equals_padded_on_any_lengths(model_path, lens, seed):
    pol = _cached(model_path)
    plen, rlen = [p for p, _ in lens], [r for _, r in lens]
    prompt, plen, resp, rlen = rows(plen, rlen, seed=seed)
    with torch.no_grad():
        lp_pad, ent_pad = pol(prompt, plen, resp, PAD)
        lp, ent = pol(prompt, plen, resp, PAD, response_len=rlen)
    m = mask_of(rlen, resp.shape[1])
    assert torch.allclose(lp[m], lp_pad[m], atol=1e-5)
    assert torch.allclose(ent[m], ent_pad[m], atol=1e-5)
    assert not lp[~m].any()


_POLICIES = {}


def _cached(path):
    if path not in _POLICIES:
        _POLICIES[path] = load(path)
    return _POLICIES[path]


def make_batch(pol, plen, rlen, seed=0, group_size=2):
    """A RolloutBatch with trainer old log-probs (padded path) and mixed rewards."""
    prompt, plen, resp, rlen = rows(plen, rlen, seed=seed)
    t = resp.shape[1]
    mask = mask_of(rlen, t)
    with torch.no_grad():
        old, _ = pol(prompt, plen, resp, PAD)
    g = torch.Generator().manual_seed(seed + 1)
    old = torch.where(mask, (old - 0.05 * torch.rand(old.shape, generator=g)).clamp(max=0), 0.0)
    b = len(rlen)
    correct = torch.rand(b, generator=g) < 0.5
    return RolloutBatch(
        old_logp=old,
        mask=mask,
        lengths=rlen,
        truncated=rlen == t,
        correct=correct,
        rewards=torch.where(correct, 1.0, -1.0),
        group_ids=torch.arange(b // group_size).repeat_interleave(group_size),
        group_size=group_size,
        extras={"prompt_ids": prompt, "prompt_len": plen, "response_ids": resp},
    )


def test_dapo_loss_and_every_gradient_equal_packed_and_padded(model_path):
    from scale.learner.policy import response_logp

    results = []
    for packed in (False, True):
        pol = load(model_path)
        batch = make_batch(pol, PLEN, RLEN)
        logp, _ent = response_logp(pol, batch, PAD, packed=packed)
        adv = torch.linspace(-1.0, 1.0, batch.size)
        loss, stats = policy_loss(logp, batch.old_logp, adv, batch.mask, ClipAgg(eps_low=0.2, eps_high=0.28))
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in pol.named_parameters()}
        results.append((float(loss.detach()), stats, grads))
    (l0, s0, g0), (l1, s1, g1) = results
    assert math.isclose(l0, l1, abs_tol=1e-5)
    assert l0 != 0.0
    for k in ("n_tokens", "clipfrac_upper", "approx_kl"):
        assert math.isclose(float(s0[k]), float(s1[k]), abs_tol=1e-5), k
    assert g0.keys() == g1.keys() and len(g0) > 5
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-5), (n, (g0[n] - g1[n]).abs().max())
    assert max(float(g.abs().max()) for g in g0.values()) > 1e-4  # the gradients are not all 0


def untied_policy():
    """A tiny Qwen2 whose output layer is its own parameter (not the embeddings)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from scale.learner.policy import Policy

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=False,
    )
    return Policy(Qwen2ForCausalLM(cfg), chunk=3)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("b", [0, 3])
def test_no_response_token_still_runs_a_backward_through_every_parameter(model_path, b, tied):
    """b == 0 or only 0-length responses: zeros of the right shape whose backward reaches
    every parameter, the output layer included (gradient exactly 0), so FSDP/DDP ranks
    stay in step."""
    from scale.learner.policy import response_logp

    pol = load(model_path) if tied else untied_policy()
    assert (pol.output_weight() is pol.lm.get_input_embeddings().weight) == tied
    prompt, plen, resp, rlen = rows([2, 1, 3][:b], [0, 0, 0][:b], t_width=4)
    lp, ent = pol(prompt, plen, resp, PAD, response_len=rlen)
    assert lp.shape == ent.shape == (b, 4) and lp.requires_grad
    assert not lp.any() and not ent.any()
    (lp.sum() + ent.sum()).backward()
    for n, p in pol.named_parameters():
        assert p.grad is not None, n
        assert not p.grad.any(), n
    batch = make_batch(pol, [2, 1], [3, 2]).select(torch.tensor([], dtype=torch.long))
    for packed in (True, False):  # an empty mini-batch takes the dummy path either way
        lp, _ = response_logp(pol, batch, PAD, packed=packed)
        assert lp.shape == (0, batch.mask.shape[1]) and lp.requires_grad


def test_bad_lengths_are_refused(model_path):
    pol = load(model_path)
    prompt, plen, resp, rlen = rows([2, 1], [1, 2])
    with pytest.raises(ValueError, match="row 1"):
        pol(prompt, torch.tensor([2, 0]), resp, PAD, response_len=rlen)
    with pytest.raises(ValueError, match="row 0"):
        pol(prompt, plen, resp, PAD, response_len=torch.tensor([5, 2]))


def test_update_with_token_budget_equals_fixed_micro_batches(model_path):
    """SGD on a fixed batch: packed forwards in token-budget micro-batches (padded with
    empty ones up to a simulated max over ranks) give the weights and metrics of padded
    forwards in fixed-size micro-batches."""
    from scale.learner.policy import response_logp, row_tokens, token_budget_splitter

    plen = [3, 1, 5, 2, 1, 4, 1, 6, 2, 3, 1, 2]
    rlen = [5, 1, 7, 1, 2, 0, 4, 3, 6, 2, 1, 7]
    cfg = AlgoConfig(
        group_size=2, train_groups=6, mini_batch_groups=3, max_grad_norm=1.0, eps_high=0.28, ppo_epochs=2
    )
    calls = []

    def spy_max(n):
        calls.append(n)
        return n + 2  # another rank needs two more micro-batches

    out = []
    for packed in (False, True):
        pol = load(model_path)
        batch = make_batch(pol, plen, rlen, seed=3)
        opt = torch.optim.SGD(pol.parameters(), lr=0.5)
        counts = []

        def logp_fn(mb, pol=pol, packed=packed, counts=counts):
            counts.append(mb.size)
            return response_logp(pol, mb, PAD, packed=packed)

        if packed:
            split = token_budget_splitter(batch, budget=10, all_reduce_max=spy_max)
            m = update(batch, logp_fn, opt, cfg, micro_batches=split)
        else:
            m = update(batch, logp_fn, opt, cfg, micro_batch_size=2)
        out.append(({k: v.detach().clone() for k, v in pol.state_dict().items()}, m, counts))
    (w0, m0, _), (w1, m1, c1) = out
    assert m0["actor/optimizer_steps"] == 4
    assert 0 in c1 and calls  # empty micro-batches ran
    assert max(p + r for p, r in zip(plen, rlen)) > 10  # a row over budget gets a bin alone
    assert int(row_tokens(batch)[5]) == 0  # a row with no response costs nothing
    start = load(model_path).state_dict()
    assert max(float((w0[k] - start[k]).abs().max()) for k in start) > 1e-3
    for k in w0:
        assert torch.allclose(w0[k], w1[k], atol=1e-5), (k, (w0[k] - w1[k]).abs().max())
    assert m0.keys() == m1.keys()
    for k in m0:
        assert math.isclose(m0[k], m1[k], rel_tol=1e-4, abs_tol=1e-5) or (
            math.isnan(m0[k]) and math.isnan(m1[k])
        ), (k, m0[k], m1[k])
