"""The experiment registry: one module per failure mode, in the paper's order."""

from ..experiment import Experiment
from . import entropy_collapse, length_bias, truncation_noise, zero_gradient

REGISTRY: dict[str, Experiment] = {
    m.EXPERIMENT.name: m.EXPERIMENT for m in (entropy_collapse, zero_gradient, length_bias, truncation_noise)
}
