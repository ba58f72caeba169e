"""Gradient strategies behind one `Strategy` seam: plain DDP, Invariant (bitwise for any device count), ZeRO-1,
FSDP."""

import ml_collections

from jaxdp.strategies.base import DataAxis, Gradients, GradFn, Strategy, StrategyOptions
from jaxdp.strategies.fsdp import FSDP
from jaxdp.strategies.invariant import Invariant
from jaxdp.strategies.plain import DataParallel
from jaxdp.strategies.zero1 import ZeRO1

# The first strategy whose `config.parallel.<flag>` is set, else plain data parallelism; FSDP first, so that its
# `validate` names what it cannot be combined with.
REGISTRY: tuple[type[Strategy], ...] = (FSDP, Invariant, ZeRO1)
DEFAULT: type[Strategy] = DataParallel

__all__ = ["DEFAULT", "FSDP", "REGISTRY", "DataAxis", "DataParallel", "Gradients", "GradFn", "Invariant", "Strategy",
           "StrategyOptions", "ZeRO1", "select"]


def select(config: ml_collections.ConfigDict) -> type[Strategy]:
  """The strategy the config asks for by its `config.parallel` flag (see REGISTRY); defaults filled."""
  return next((cls for cls in REGISTRY if config.parallel[cls.flag]), DEFAULT)
