"""Python's garbage collector in the loop: at fixed steps (docs/design-notes.md#garbage-collection)."""

import gc

import jaxdp

# The loop collects the young generations every this many steps. Why: docs/design-notes.md#garbage-collection
EVERY_STEPS = 50


class Collector:
  """Inside: automatic collection off, the objects alive on entry frozen; `after(step)` collects every N steps."""

  def __init__(self, every_steps: int):
    self.every_steps = every_steps  # 0: Python's automatic collection stays as it is.
    self._was_enabled = self._was_frozen = False  # As found on entry.

  def __enter__(self) -> "Collector":
    if self.every_steps > 0:
      self._was_enabled, self._was_frozen = gc.isenabled(), gc.get_freeze_count() > jaxdp._FROZEN_AT_START
      gc.disable()
      gc.freeze()  # O(1): no full collection here (docs/design-notes.md#garbage-collection).
    return self

  def after(self, step: int) -> None:
    """Collects the young generations when `step` is a multiple of `every_steps`."""
    if self.every_steps > 0 and step % self.every_steps == 0:
      gc.collect(1)

  def __exit__(self, *exc: object) -> None:
    if self.every_steps > 0:
      if not self._was_frozen:  # gc can only unfreeze everything: a caller's own frozen objects stay frozen.
        gc.unfreeze()
      if self._was_enabled:
        gc.enable()
