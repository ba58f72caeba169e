"""Small host batches travel to the devices several steps at a time: one transfer per block of steps.

Placing a batch costs the host about the same whatever its size (Python, one buffer per array and device;
docs/design-notes.md#loop-host-costs). For a
split with nothing to decode (cached, token file, in memory) the batches are small and ready at once, so the
prefetch thread stacks `steps` of them, the backend places the block in one call (`Backend.put_block`), and
every step of the block passes the same device block: the step (`select`) takes its own batch out of it by
the state's step number, on the device. The batches, and so the results, are bitwise the ones placed step by
step; the last block is padded with copies of its last batch (one program shape; the copies are never read).
"""

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax import lax

from jaxdp.data import Dataset, stream
from jaxdp.data.dataset import CACHE_AUTO
from jaxdp.data.source import TfdsCorpus

PyTree = Any
Block = tuple[dict[str, np.ndarray], np.ndarray]  # (each feature stacked [steps, rows, ...], first step: int32 [])
MAX_STEPS = 64  # Beyond this the transfer's cost per step is already small; more only reads ahead.


def steps_per_block(ds: Dataset, rows: int, block_mb: float) -> int:
  """Steps per transfer for `rows` rows a step of `ds`: as many as fit in `block_mb` MiB, at most MAX_STEPS;
  1 (a transfer per step) for batches tf.data decodes, whose reading ahead would also raise a bad example's
  error that many steps early."""
  if not stream.on_host(ds):
    return 1
  return steps_fitting(rows * ds.row_bytes(), block_mb)


def steps_fitting(step_bytes: int, block_mb: float) -> int:
  """Steps of `step_bytes` each in one transfer: as many as fit in `block_mb` MiB, at most MAX_STEPS; 1 with 0."""
  if block_mb <= 0:
    return 1
  return int(max(1, min(MAX_STEPS, block_mb * 2**20 // max(1, step_bytes))))


def stack(batches: Iterator[dict[str, np.ndarray]], steps: int, first_step: int) -> Iterator[tuple[Block, int]]:
  """The host batches of steps first_step, first_step + 1, ... as blocks of `steps`, each with how many of its
  steps are real: fewer in the last block, and in one cut short by a failed read, whose error the next block
  raises, so that it surfaces at the step whose batch failed, as it does one transfer per step."""
  for first in itertools.count(first_step, steps):
    chunk, error = [], None
    try:
      chunk.extend(itertools.islice(batches, steps))
    except Exception as e:
      if not chunk:
        raise
      error = e
    if not chunk:
      return
    real = len(chunk)
    chunk += [chunk[-1]] * (steps - real)  # Same shape as every block: the step compiles once.
    yield ({k: np.stack([b[k] for b in chunk]) for k in chunk[0]}, np.array(first, np.int32)), real
    if error is not None:
      raise error


def repeat(blocks: Iterator[tuple[PyTree, int]]) -> Iterator[PyTree]:
  """Each device block once per real step it holds (the loop asks one batch per step)."""
  for block, real in blocks:
    yield from itertools.repeat(block, real)


def select(step: Callable[..., Any]) -> Callable[..., Any]:
  """The per-replica `step(state, batch, **kw)` as `(state, block, **kw)`: on the block's batch of `state.step`."""

  def block_step(state: Any, block: PyTree, **kwargs: Any) -> Any:
    batches, first = block
    k = state.step - first
    batch = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, k, 0, keepdims=False), batches)
    return step(state, batch, **kwargs)

  # The program keeps the step's name (jit_train_step): XLA dumps and profiles are found by it.
  block_step.__name__ = block_step.__qualname__ = getattr(getattr(step, "func", step), "__name__", "step")
  return block_step


def describe(ds: Dataset, rows: int, steps: int, block_mb: float, prefetch: int) -> str:
  """The start summary's `input` line: how host batches of `rows` rows reach the devices (`steps` per transfer,
  as `steps_per_block` chose for `ds`), and why."""
  ahead = f"{prefetch} ahead by a thread" if prefetch > 0 else "placed when the step asks"
  if steps > 1:
    return (f"{steps} steps' batches per transfer (nothing to decode; parallel.block_mb={block_mb:g}), "
            f"{ahead}; the step takes its batch from the block on the devices")
  if block_mb <= 0:
    why = "parallel.block_mb=0"
  elif not stream.on_host(ds):
    why = "batches decoded by tf.data" + _uncached(ds)
  else:
    mib = rows * ds.row_bytes() / 2**20
    why = (f"one step's batch, {mib:.3g} MiB, is over parallel.block_mb={block_mb:g}" if mib > block_mb else
           f"two steps' batches, {2 * mib:.3g} MiB, are over parallel.block_mb={block_mb:g}")
  return f"one transfer per step ({why}), {ahead}"


def _uncached(ds: Dataset) -> str:
  """Why a TFDS dataset that could be held decoded in memory is not: its size against `dataset.cache_mb`."""
  mib = ds.corpus.decoded_mib() if isinstance(ds.corpus, TfdsCorpus) else None
  if mib is None:
    return ""
  setting, budget = ds.options.cache_mb, ds.options.cache_budget_mib
  size = f"{mib:,.{0 if mib >= 10 else 1}f} MiB"
  if not budget:
    return f": dataset.cache_mb={setting} (its splits take {size} decoded)"
  here = f" ({budget:,.0f} MiB here)" if setting == CACHE_AUTO else " MiB"
  return f": its splits take {size} decoded, more than dataset.cache_mb={setting}{here} holds in memory"
