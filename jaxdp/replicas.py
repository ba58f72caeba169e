"""Replica-consistency sentinel: every replica of the parameters must be bitwise the same."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils

PyTree = object
_MIX = np.uint32(2654435761)  # Knuth's multiplicative hash constant: weights positions, so swaps show.


class ReplicaMismatchError(RuntimeError):
  """Replicas that should be identical differ."""


@jax.jit
def _fingerprint(leaves: list[jax.Array]) -> jax.Array:
  """A uint32 hash of the bits of all leaves on one device."""
  total = jnp.uint32(0)
  for i, x in enumerate(leaves):
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32).reshape(-1)
    weights = jnp.arange(bits.size, dtype=jnp.uint32) * _MIX + jnp.uint32(2 * i + 1)
    total = total + jnp.sum(bits * weights, dtype=jnp.uint32)
  return total


def fingerprints(tree: PyTree) -> dict[int, int]:
  """Device id -> fingerprint of that device's copy of a replicated tree, over all processes."""
  per_device: dict[jax.Device, list] = collections.defaultdict(list)
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      per_device[shard.device].append(shard.data)
  local = sorted(per_device, key=lambda d: d.id)
  pairs = np.array([[d.id, int(_fingerprint(per_device[d]))] for d in local], dtype=np.int64)
  if jax.process_count() > 1:
    pairs = np.asarray(multihost_utils.process_allgather(pairs)).reshape(-1, 2)
  return {int(i): int(f) for i, f in pairs}


def check(tree: PyTree) -> None:
  """Raises ReplicaMismatchError naming the replicas (devices) whose copy differs from the majority."""
  prints = fingerprints(tree)
  majority = collections.Counter(prints.values()).most_common(1)[0][0]
  bad = sorted(d for d, f in prints.items() if f != majority)
  if bad:
    devices = {d.id: d for d in jax.devices()}
    names = ", ".join(f"replica on device {d} (process {devices[d].process_index})" for d in bad)
    raise ReplicaMismatchError(f"parameters differ across replicas: {names} differ from the other "
                               f"{len(prints) - len(bad)} of {len(prints)}")
