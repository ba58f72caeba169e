"""A user's own loop (weighted task, NNX model, Adam) on `jaxdp.DataParallel`, resumable; in-process or as a script
(`python tests/fsdp_train.py WORKDIR`, or under `jaxdp.launch`): process 0 saves WORKDIR/final.npz."""

import os

import jax
import numpy as np
import optax
from flax import nnx

import weighted_tasks

BATCH = 64


def train(workdir: str, steps: int = 30, checkpoint_every: int = 0, **options) -> dict[str, np.ndarray]:
  """`steps` steps from WORKDIR's newest checkpoint (or the seed) with DataParallel(**options); host params by path."""
  import jaxdp
  with jaxdp.DataParallel(**options) as dp:
    state = dp.init(weighted_tasks.MLP(rngs=nnx.Rngs(0)), optax.adam(1e-2))
    state, start = dp.restore(workdir, state)
    step_fn = dp.train_step(weighted_tasks.weighted)
    for step, batch in enumerate(dp.batches(weighted_tasks.arrays(), batch_size=BATCH, start_step=start,
                                            stop_step=steps), start + 1):
      state, _ = step_fn(state, batch)
      if checkpoint_every and step % checkpoint_every == 0:
        dp.save(workdir, state)
    params = dp.backend.get(state.params)
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}


def main(argv: list[str]) -> None:
  import argparse
  from jaxdp.runtime import cpu_devices
  parser = argparse.ArgumentParser()
  parser.add_argument("workdir")
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--checkpoint_every", type=int, default=0)
  parser.add_argument("--shard_params", action="store_true")
  args = parser.parse_args(argv)
  cpu_devices.simulate(cpu_devices.requested([]) or 1)  # Before JAX first uses a device.
  final = train(args.workdir, args.steps, args.checkpoint_every, shard_params=args.shard_params)
  if jax.process_index() == 0:
    np.savez(os.path.join(args.workdir, "final.npz"), **final)


if __name__ == "__main__":
  import sys
  main(sys.argv[1:])
