"""A user's training script, as a user writes one: an NNX model of two inputs (image and mask) with dropout,
defined here (`__main__.Net` when run), a loss of its own (Huber) with a metric of its own (a max), on a
features-dict dataset (`feature_datasets:Scenes`: image, mask, float target) or the same in memory.

    python tests/my_train.py --workdir DIR --data_dir TFDS_DIR [--steps N] [--invariant] [--task_name NAME]
        [--in_memory] [--save]
    python -m jaxdp.launch --num_processes 2 --devices_per_process 4 -- tests/my_train.py --workdir DIR ...

Its devices: JAXDP_CPU_DEVICES (the launcher sets it; default 1). With --save, process 0 writes the final
parameters to WORKDIR/final.npz. Importable (`my_train:huber` names the task): the run is under `__main__`.
"""

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdp.runtime import cpu_devices



def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
  """In-memory features like Scenes': an 8x8 RGB image, its boolean mask, a float target [2]."""
  rng = np.random.default_rng(seed)
  image = rng.integers(0, 256, (n, 8, 8, 3)).astype(np.uint8)
  return {"image": image, "mask": image[..., 0] > 127, "target": rng.normal(size=(n, 2)).astype(np.float32)}


def huber(model, batch, delta: float = 1.0):
  """Huber loss of `model(image, mask)` against the float target; metrics: `abs_err` (mean), `max_err` (max)."""
  from jaxdp.tasks import Metric
  error = model(batch["image"], batch["mask"]).astype(jnp.float32) - batch["target"]
  size = jnp.abs(error)
  loss = jnp.where(size < delta, 0.5 * error ** 2, delta * (size - 0.5 * delta)).mean(-1)
  return loss, {"abs_err": size.mean(-1), "max_err": Metric(size.max(-1), reduce="max")}


class Net(nnx.Module):
  """Two inputs: the image, masked, flattened, through a hidden layer with dropout, to the target's 2 values."""

  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(8 * 8 * 3, 32, rngs=rngs)
    self.dropout = nnx.Dropout(0.2, rngs=rngs)
    self.out = nnx.Linear(32, 2, rngs=rngs)

  def __call__(self, image: jax.Array, mask: jax.Array) -> jax.Array:
    x = image.astype(jnp.float32) / 255.0 * mask[..., None]
    return self.out(self.dropout(nnx.relu(self.hidden(x.reshape(x.shape[0], -1)))))


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--data_dir", default="")
  parser.add_argument("--in_memory", action="store_true")
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--checkpoint_every", type=int, default=4)
  parser.add_argument("--invariant", action="store_true")
  parser.add_argument("--task_name", default="", help="Name the task in the config instead of passing it.")
  parser.add_argument("--save", action="store_true")
  args = parser.parse_args(argv)
  cpu_devices.simulate(cpu_devices.requested([]) or 1)  # Before JAX first uses a device.
  import jaxdp
  from jaxdp.configs import default
  config = default.get_config()
  config.model.name = "mlp"  # Replaced by the object below; the config's other model fields stay out.
  config.dataset.name, config.dataset.data_dir = "feature_datasets:Scenes", args.data_dir
  config.dataset.eval_split, config.eval_batch_size = "test", 16
  config.batch_size, config.num_train_steps, config.learning_rate = 16, args.steps, 1e-2
  config.log_every_steps, config.eval_every_steps = 1, args.steps
  config.checkpoint_every_steps = args.checkpoint_every
  config.audit_data = True
  config.task.delta = 0.5
  config.parallel.invariant = args.invariant
  config.task.name = args.task_name  # "": the task is the object passed below.
  task = None if args.task_name else huber
  data = {"train_data": make_data(48, 0), "eval_data": make_data(20, 1)} if args.in_memory else {}
  result = jaxdp.train_and_evaluate(config, args.workdir, model=Net, task=task, **data)
  if args.save and jax.process_index() == 0:
    flat = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(result.params)}
    np.savez(os.path.join(args.workdir, "final.npz"), **flat)


if __name__ == "__main__":
  main(sys.argv[1:])
