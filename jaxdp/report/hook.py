"""`jaxdp.Hook`, the base of the user's hooks and of the trackers, and `StepInfo`, what a hook is called with."""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """What a hook is called with: `metrics` as host floats, the same on every process (docs/hooks.md)."""
  step: int
  metrics: Mapping[str, float]
  state: Any
  workdir: str
  host: Callable[[Any], Any] = dataclasses.field(default=lambda tree: tree, repr=False, compare=False)

  @property
  def params(self) -> Any:
    """The parameters on the host, one copy (numpy)."""
    return self.host(self.state.params)


class Hook:
  """Override the calls you need; each may return `jaxdp.STOP` (the run stops at this step, checkpointed).

  `on_step` runs at the multiples of `every` (0: never). `on_start` runs once before the first step,
  `on_write(step, scalars)` with every record the loop writes (a tracker: numbers only), `close` when the run ends.
  """
  every: int = 0

  def on_start(self, info: StepInfo) -> Any: ...

  def on_log(self, info: StepInfo) -> Any: ...

  def on_eval(self, info: StepInfo) -> Any: ...

  def on_checkpoint(self, info: StepInfo) -> Any: ...

  def on_step(self, info: StepInfo) -> Any: ...

  def on_write(self, step: int, scalars: Mapping[str, float]) -> None: ...

  def close(self) -> None: ...
