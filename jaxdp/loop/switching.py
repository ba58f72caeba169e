"""Python's GIL switch interval during the loop: short, so the loop's thread gets the GIL back from the prefetch
thread soon after it asks.

When the loop takes a batch, the prefetch thread wakes and runs Python (the next gather, its placement) while
the loop's thread waits for the GIL to dispatch the step, by default up to Python's 5 ms switch interval. On the
one-process MLP that wait was 1.2-2.0 ms a step (booked as input) and 0.5 ms took 0.95 of the wall per step
(experiments/four_way_zen4_mlp1_input.md, "Why jaxdp trails the plain loop").
"""

import sys
import types


class SwitchInterval:
  """A context for the loop: `sys.setswitchinterval(ms / 1000)` inside, the interval found on entry after.

  `ms` 0: Python's interval stays as it is.
  """

  def __init__(self, ms: float):
    self.ms = ms
    self._was: float | None = None  # As found on entry.

  def __enter__(self) -> "SwitchInterval":
    if self.ms > 0:
      self._was = sys.getswitchinterval()
      sys.setswitchinterval(self.ms / 1000)
    return self

  def __exit__(self, kind: type | None, error: BaseException | None, trace: types.TracebackType | None) -> None:
    if self._was is not None:
      sys.setswitchinterval(self._was)
