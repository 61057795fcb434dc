import math

import pytest
import torch

from dapo import AlgoConfig, update
from toybench.policies import GRUPolicy, TabularPolicy
from toybench.runner import rollout_round
from toybench.tasks import TASKS, episode_end, verify


@pytest.mark.parametrize("name", ["composite", "truncation", "length"])
def test_exact_accuracy_and_length_match_monte_carlo(name):
    task = TASKS[name]()
    g = torch.Generator().manual_seed(0)
    pol = TabularPolicy(task, g, init_noise=0.5)
    n = 4000
    prompts = torch.arange(task.num_prompts).repeat_interleave(n)
    tokens = pol.sample(prompts, g)
    lengths, truncated = episode_end(tokens, task.max_len)
    u = torch.rand(prompts.shape[0], generator=g, dtype=torch.float64)
    out = verify(task, prompts, tokens, lengths, truncated, u)
    mc = out.correct.double().view(task.num_prompts, n).mean(1)
    exact = pol.exact_accuracy()
    assert torch.allclose(mc, exact, atol=4 * math.sqrt(0.25 / n))
    # expected length per (prompt, path)
    lens = pol.exact_lengths()
    for p in range(task.num_prompts):
        for k in range(task.num_paths):
            sel = (prompts == p) & (out.path == k + 1)
            if int(sel.sum()) > 300:
                emp = lengths[sel].double()
                se = float(emp.std()) / math.sqrt(emp.numel())
                assert abs(float(emp.mean()) - float(lens[p, k])) < 4.5 * se + 1e-9


def test_gru_sampling_matches_teacher_forced_logprobs():
    task = TASKS["composite"]()
    g = torch.Generator().manual_seed(1)
    pol = GRUPolicy(task, g)
    prompts = torch.arange(task.num_prompts).repeat_interleave(500)
    tokens = pol.sample(prompts, g)
    logp, ent = pol.logp_entropy(prompts, tokens)
    assert logp.shape == tokens.shape and torch.all(logp <= 0) and torch.all(ent >= 0)
    # first-token frequencies match the teacher-forced first-token distribution
    first = pol.first_token_probs(torch.arange(task.num_prompts))
    freq = (
        torch.stack(
            [
                torch.bincount(tokens[prompts == p, 0], minlength=task.vocab_size)
                for p in range(task.num_prompts)
            ]
        ).double()
        / 500
    )
    assert torch.allclose(freq, first, atol=0.08)


def test_entropy_change_matches_first_order_covariance_prediction():
    """For a softmax, dH = -Cov_pi(log pi, delta z): check a real tabular SGD step of the
    DAPO update against that prediction, state by state."""
    task = TASKS["entropy"]()
    cfg = AlgoConfig(
        group_size=8,
        train_groups=16,
        mini_batch_groups=16,
        expected_len=6,
        cache_len=2,
        overlong_filter=False,
        soft_overlong=False,
        dynamic_sampling=False,
        max_grad_norm=None,
    )
    g = torch.Generator().manual_seed(3)
    pol = TabularPolicy(task, g)
    batch = rollout_round(pol, task, cfg, cfg.train_groups, g)
    before = pol.table.detach().clone()
    opt = torch.optim.SGD(pol.parameters(), lr=0.05)
    update(batch, lambda mb: pol.logp_entropy(mb.extras["prompts"], mb.extras["tokens"]), opt, cfg)
    after = pol.table.detach()
    delta = after - before

    def entropy(z):
        lp = torch.log_softmax(z, -1)
        return -(lp.exp() * lp).sum(-1)

    lp = torch.log_softmax(before, -1)
    pi = lp.exp()
    cov = (pi * lp * delta).sum(-1) - (pi * lp).sum(-1) * (pi * delta).sum(-1)
    predicted = -cov
    actual = entropy(after) - entropy(before)
    moved = delta.abs().amax(-1) > 1e-9
    assert int(moved.sum()) > 20
    err = (actual - predicted)[moved].abs()
    assert float(err.max()) < 0.05 * float(actual[moved].abs().max())
    assert torch.corrcoef(torch.stack([actual[moved], predicted[moved]]))[0, 1] > 0.999
