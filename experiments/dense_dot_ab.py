"""A/B of jaxdp.models.dense_dot against an older revision of it: the MLP 784-1024-1024-10's fwd+bwd, alternating.

    taskset -c 1 python experiments/dense_dot_ab.py --baseline_rev f6d00a9 --rounds 12   # one core
    python experiments/dense_dot_ab.py --baseline_rev f6d00a9 --rounds 12                # both cores

Both versions run in one process (the old dense.py loaded from `git show REV:jaxdp/models/dense.py`), in
turn each round; reports whether their gradients are bitwise equal, ms per call and the per-round ratio.
"""

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxdp.models import dense

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402


def mlp_loss(dot: Callable[..., jax.Array], params: list[tuple[jax.Array, jax.Array]], x: jax.Array,
             y: jax.Array) -> jax.Array:
  """Cross-entropy of the MLP with `dot` as every layer's product."""
  h = x
  for i, (w, b) in enumerate(params):
    h = dot(h, w, (((1,), (0,)), ((), ()))) + b
    if i < len(params) - 1:
      h = jax.nn.relu(h)
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(h), y[:, None], 1))


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--baseline_rev", required=True)
  parser.add_argument("--rounds", type=int, default=12)
  parser.add_argument("--calls", type=int, default=5, help="Timed calls per version per round.")
  parser.add_argument("--rows", type=int, default=512, help="Batch rows (one process's share of 1024 on 2).")
  args = parser.parse_args(argv)
  key = jax.random.key(0)
  sizes = [784, 1024, 1024, 10]
  params = [(jax.random.normal(key, (a, b)) * 0.03, jnp.zeros(b)) for a, b in zip(sizes[:-1], sizes[1:])]
  x, y = jax.random.normal(key, (args.rows, 784)), jnp.zeros(args.rows, jnp.int32)
  old = abrun.module_at(args.baseline_rev, "jaxdp/models/dense.py", "dense_old")
  versions = {args.baseline_rev: old.dense_dot, "this": dense.dense_dot}
  grads = {name: jax.jit(jax.grad(functools.partial(mlp_loss, dot))) for name, dot in versions.items()}
  outs = [jax.tree.leaves(g(params, x, y)) for g in grads.values()]
  print("gradients bitwise equal:", all(bool((a == b).all()) for a, b in zip(*outs)))
  ms = {name: [] for name in grads}
  for r in range(args.rounds):
    for name, g in (list(grads.items()) if r % 2 else list(grads.items())[::-1]):  # A B, B A, ...
      start = time.perf_counter()
      for _ in range(args.calls):
        jax.block_until_ready(g(params, x, y))
      ms[name].append((time.perf_counter() - start) / args.calls * 1e3)
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  print(f"{cores} core(s); rows {args.rows}; {args.rounds} rounds x {args.calls} calls; load {os.getloadavg()[0]:.1f}")
  for name, values in ms.items():
    print(f"{name}: median {statistics.median(values):.2f} ms (min {min(values):.2f}, max {max(values):.2f})")
  ratio = [b / a for a, b in zip(*ms.values())]
  print(f"this / {args.baseline_rev} per round: {statistics.median(ratio):.3f} ({min(ratio):.3f}..{max(ratio):.3f})")


if __name__ == "__main__":
  main(sys.argv[1:])
