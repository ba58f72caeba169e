"""Replica-consistency sentinel: every replica of the parameters must be bitwise the same."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils

from jaxdp.parallel import Backend

PyTree = object
_MIX = np.uint32(2654435761)  # Knuth's multiplicative hash constant: weights positions, so swaps show.


class ReplicaMismatchError(RuntimeError):
  """Replicas that should be identical differ."""


def _fingerprint(tree: PyTree) -> jax.Array:
  """A uint32 hash of the bits of all leaves (one device's copy)."""
  total = jnp.uint32(0)
  for i, x in enumerate(jax.tree.leaves(tree)):
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32).reshape(-1)
    weights = jnp.arange(bits.size, dtype=jnp.uint32) * _MIX + jnp.uint32(2 * i + 1)
    total = total + jnp.sum(bits * weights, dtype=jnp.uint32)
  return total


class Sentinel:
  """Compares a fingerprint of every replica of a replicated tree (the step compiles once)."""

  def __init__(self, backend: Backend):
    self.per_device, self.backend = backend.map_per_device(_fingerprint), backend

  def check(self, tree: PyTree) -> None:
    """Raises ReplicaMismatchError naming the replicas (devices) whose copy differs from the majority."""
    shards = self.per_device(self.backend.replicated(tree)).addressable_shards
    pairs = np.array([[s.device.id, int(np.asarray(s.data).reshape(-1)[0])] for s in shards], dtype=np.int64)
    if jax.process_count() > 1:
      pairs = np.asarray(multihost_utils.process_allgather(pairs)).reshape(-1, 2)
    prints = {int(i): int(f) for i, f in pairs}  # Device id -> its copy's fingerprint, over all processes.
    majority = collections.Counter(prints.values()).most_common(1)[0][0]
    bad = sorted(d for d, f in prints.items() if f != majority)
    if bad:
      devices = {d.id: d for d in jax.devices()}
      names = ", ".join(f"replica on device {d} (process {devices[d].process_index})" for d in bad)
      raise ReplicaMismatchError(f"parameters differ across replicas: {names} differ from the other "
                                 f"{len(prints) - len(bad)} of {len(prints)}")
