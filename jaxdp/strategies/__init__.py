"""Gradient strategies: how one replica's gradient is reduced across devices and applied.

`DataParallel` (plain DDP), `Invariant` (bitwise the same for any device count) and `ZeRO1` (sharded
optimizer state) implement one small interface, `Strategy`; `jaxdp.build` picks one per run.
"""

from jaxdp.strategies.base import DataAxis, Gradients, GradFn, StepOptions, Strategy
from jaxdp.strategies.invariant import Invariant
from jaxdp.strategies.plain import DataParallel
from jaxdp.strategies.zero1 import ZeRO1

__all__ = ["DataAxis", "DataParallel", "Gradients", "GradFn", "Invariant", "StepOptions", "Strategy", "ZeRO1"]
