"""Python's garbage collector during the loop: at fixed steps, not wherever an allocation happens to trigger it.

Left automatic, a collection runs in whichever thread allocates: in the loop's step dispatch or in its wait for
a batch (booked as input), or in the prefetch thread while it holds the GIL, and the first full collection after
compiling walks every object tracing made (docs/design-notes.md#garbage-collection). In a multi-process
run a pause on one process stalls every other at the next all-reduce; at fixed steps all processes pause at once.
"""

import gc
import types

# The loop collects the young generations every this many steps. Why: docs/design-notes.md#garbage-collection
EVERY_STEPS = 50


class Collector:
  """A context for the loop: automatic collection off inside; `after(step)` collects every `every_steps` steps.

  `every_steps` 0: Python's automatic collection stays as it is. On entry the objects alive so far (the model,
  the compiled programs, the libraries) are frozen out of later collections, which then walk only what the
  loop made; on exit they are unfrozen (unless the caller had frozen objects of its own: gc unfreezes all or
  nothing) and automatic collection is switched back on if it was on.
  """

  def __init__(self, every_steps: int):
    self.every_steps = every_steps
    self._was_enabled = self._was_frozen = False  # As found on entry.

  def __enter__(self) -> "Collector":
    if self.every_steps > 0:
      self._was_enabled, self._was_frozen = gc.isenabled(), gc.get_freeze_count() > 0
      gc.disable()
      gc.freeze()  # O(1): no full collection here (docs/design-notes.md#garbage-collection).
    return self

  def after(self, step: int) -> None:
    """Collects the young generations when `step` is a multiple of `every_steps`."""
    if self.every_steps > 0 and step % self.every_steps == 0:
      gc.collect(1)

  def __exit__(self, kind: type | None, error: BaseException | None, trace: types.TracebackType | None) -> None:
    if self.every_steps > 0:
      if not self._was_frozen:  # gc can only unfreeze everything: a caller's own frozen objects stay frozen.
        gc.unfreeze()
      if self._was_enabled:
        gc.enable()
