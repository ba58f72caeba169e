"""A user's training script, as a user writes one: an NNX model of two inputs with dropout defined here (in
`__main__`), a focal loss with a metric of its own, in-memory arrays, `jaxdp.train_and_evaluate`.

    python tests/my_train.py --workdir DIR [--steps N] [--invariant] [--task_name NAME] [--save]
    python -m jaxdp.launch --num_processes 2 --devices_per_process 4 -- tests/my_train.py --workdir DIR ...

Its devices: JAXDP_CPU_DEVICES (the launcher sets it; default 1). With --save, process 0 writes the final
parameters to WORKDIR/final.npz. Importable (`my_train:focal`): the run itself is under `__main__`.
"""

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdp.runtime import cpu_devices

NUM_CLASSES = 3


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
  """A features dict: an image, its mask, and a class that depends on both (the masked image's sum)."""
  rng = np.random.default_rng(seed)
  image = rng.normal(size=(n, 4, 4, 1)).astype(np.float32)
  mask = (rng.random((n, 4, 4)) > 0.3).astype(np.float32)
  score = (image[..., 0] * mask).sum((1, 2))
  target = np.digitize(score, [-1.0, 1.0]).astype(np.int32)
  return {"image": image, "mask": mask, "target": target}


def focal(model, batch, gamma: float = 2.0):
  """Focal loss (Lin et al., 2017) of `model(image, mask)` on `target`; metrics: `hit` (mean), `top_p` (max)."""
  from jaxdp.tasks import Metric
  logits = model(batch["image"], batch["mask"]).astype(jnp.float32)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits), batch["target"][:, None], -1)[:, 0]
  loss = -((1.0 - jnp.exp(logp)) ** gamma) * logp
  hit = (jnp.argmax(logits, -1) == batch["target"]).astype(jnp.float32)
  return loss, {"hit": hit, "top_p": Metric(jnp.exp(logp), reduce="max")}


class Net(nnx.Module):
  """Two inputs: the image is masked, flattened, and goes through a hidden layer with dropout."""

  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(16, 32, rngs=rngs)
    self.dropout = nnx.Dropout(0.2, rngs=rngs)
    self.out = nnx.Linear(32, NUM_CLASSES, rngs=rngs)

  def __call__(self, image: jax.Array, mask: jax.Array) -> jax.Array:
    x = (image[..., 0] * mask).reshape(image.shape[0], -1)
    return self.out(self.dropout(nnx.relu(self.hidden(x))))


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
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
  config.batch_size, config.num_train_steps = 32, args.steps
  config.log_every_steps, config.eval_every_steps = 1, args.steps
  config.checkpoint_every_steps, config.check_replicas_every_steps = args.checkpoint_every, 0
  config.audit_data = True
  config.task.gamma = 1.5
  config.parallel.invariant = args.invariant
  config.task.name = args.task_name  # "": the task is the object passed below.
  task = None if args.task_name else focal
  result = jaxdp.train_and_evaluate(config, args.workdir, model=Net, task=task,
                                    train_data=make_data(512, 0), eval_data=make_data(100, 1))
  if args.save and jax.process_index() == 0:
    flat = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(result.params)}
    np.savez(os.path.join(args.workdir, "final.npz"), **flat)


if __name__ == "__main__":
  main(sys.argv[1:])
