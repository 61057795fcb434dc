"""A one-process run's checkpoint is written and read without torch's warning that it
"assumes the intent" to work in a single process (DCP is told so: ``no_dist``)."""

import warnings

import torch

from scale.learner import checkpoint


def test_one_process_save_and_resume_without_a_torch_warning(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        path = checkpoint.save(
            tmp_path, 1, model=model, optimizer=opt, scheduler_state={}, rank_state={}, trainer_state={},
            hf_save=lambda d: d.mkdir(), rank=0, keep=2, barrier=lambda: None,
        )  # fmt: skip
        again = torch.nn.Linear(3, 2)
        again_opt = torch.optim.AdamW(again.parameters(), lr=0.1)
        again(torch.ones(1, 3)).sum().backward()
        again_opt.step()
        checkpoint.load(path, model=again, optimizer=again_opt)
    assert torch.equal(again.weight, model.weight)
    assert torch.equal(again_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
