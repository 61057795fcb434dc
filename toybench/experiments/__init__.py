"""The experiment registry: one module per failure mode, in the paper's order; and the
experiments beyond the paper (not in ``dapo toy run all``, not in the toy gate)."""

from ..experiment import Experiment
from . import entropy_collapse, length_bias, prompt_selection, truncation_noise, zero_gradient

REGISTRY: dict[str, Experiment] = {
    m.EXPERIMENT.name: m.EXPERIMENT for m in (entropy_collapse, zero_gradient, length_bias, truncation_noise)
}
BEYOND: dict[str, Experiment] = {prompt_selection.EXPERIMENT.name: prompt_selection.EXPERIMENT}
"""Experiments past the paper's four failure modes: ``dapo toy run <name>``."""
