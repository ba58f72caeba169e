"""A train split held on the devices: only row ids travel, and each step gathers its own rows there.

A split with nothing to decode, held whole by its source and not augmented (`jaxdp.data.held`), is placed on every
device once, finished as its batches are, when its copies on this process's devices take at most
`parallel.resident_mb` MiB. The host then makes no batch at all: the train stream yields each step's row ids
(`train_batches(row_ids=True)`), blocks of them travel as `jaxdp.blocks` does, and the step gathers its rows from the
split on the device. The batches, and so the results, are bitwise those of the host's gather. What it removes is the
host's part: the prefetch thread's gather and transfer of every batch. On a CPU the device's gather then sits on
the step's path, where the host's overlapped it: slower there (`AUTO_MIB`;
docs/design-notes.md#train-split-held-on-the-devices).
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import blocks, parallel
from jaxdp import config as config_lib
from jaxdp.batch import ROWS
from jaxdp.data import Batch, Dataset, held

PyTree = Any
ID_BYTES = 4  # A row id as blocks carry it: int32.
AUTO_MIB = 1024.0  # parallel.resident_mb="auto" on accelerators (unmeasured there).


def budget_mib(setting: Any, platform: str) -> float:
  """`parallel.resident_mb` in MiB on `platform` ("auto": 0 on CPU, AUTO_MIB elsewhere)."""
  if setting == "auto":
    # On CPU the device's gather sits on the step's path, where the host's overlapped it.
    # Why: docs/design-notes.md#train-split-held-on-the-devices
    return 0.0 if platform == "cpu" else AUTO_MIB
  return config_lib.mib(setting)


def fits(ds: Dataset, split: str, budget_mb: float, local_devices: int) -> bool:
  """Whether `split` of `ds` can be held and its copies on `local_devices` devices take at most `budget_mb` MiB."""
  size = held.nbytes(ds, split) if budget_mb > 0 else None
  return size is not None and size * local_devices <= budget_mb * 2**20


def steps_per_block(rows: int, block_mb: float) -> int:
  """Steps of row ids per transfer: as many as fit in `block_mb` MiB, at most `blocks.MAX_STEPS`; 1 with 0."""
  return blocks.steps_fitting(ID_BYTES * rows, block_mb)


def select(step: Callable[..., Any]) -> Callable[..., Any]:
  """The per-replica `step(state, batch, **kw)` as `(state, (row ids' block, split), **kw)`: on its rows of the split."""
  def gathered(split: Batch, state: Any, ids: Batch, **kwargs: Any) -> Any:
    # Ids come from the split's own order, always in range: "clip" never changes one (the default would fill).
    return step(state, {k: jnp.take(v, ids[ROWS], axis=0, mode="clip") for k, v in split.items()}, **kwargs)

  def held_step(state: Any, block: tuple[PyTree, Batch], **kwargs: Any) -> Any:
    ids, split = block
    return blocks.select(functools.partial(gathered, split))(state, ids, **kwargs)

  held_step.__name__ = held_step.__qualname__ = getattr(getattr(step, "func", step), "__name__", "step")
  return held_step


def describe(nbytes: int, local_devices: int, steps: int, setting: Any, prefetch: int) -> str:
  """The start summary's `input` line for a held split of `nbytes` (`held.nbytes`)."""
  mib = nbytes / 2**20
  copies = f", a copy on each of {local_devices} devices" if local_devices > 1 else ""
  ahead = f"{prefetch} ahead by a thread" if prefetch > 0 else "placed when the step asks"
  ids = "1 step's row ids" if steps == 1 else f"{steps} steps' row ids"
  return (f"the train split held on the devices ({mib:,.{0 if mib >= 10 else 1}f} MiB{copies}; "
          f"parallel.resident_mb={setting}); {ids} per transfer, {ahead}; the step gathers its rows on the devices")


def place(backend: parallel.Backend,
          split: Batch) -> Callable[[tuple[tuple[Batch, np.ndarray], int]], tuple[PyTree, int]]:
  """`put` for the prefetch: (block of row ids, real steps) -> ((device block, the split on the devices), real steps).

  The split is placed now, once; every block passes the same device arrays.
  """
  on_devices = backend.put_replicated(split)
  return lambda item: ((backend.put_block(item[0]), on_devices), item[1])
