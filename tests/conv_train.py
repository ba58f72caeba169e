"""A user's script: convolutional NNX models (tests/user_models.py) trained in invariant mode from Python on
in-memory 8x8 2-channel images with a per-pixel target; their final parameters saved to OUT.npz.

    JAXDP_CPU_DEVICES=N python tests/conv_train.py OUT.npz [--steps S]
"""

import argparse
import os
import sys
import tempfile

import numpy as np

from jaxdp.runtime import cpu_devices

MODELS = ("ConvNNX", "ConvDenseNNX")


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
  """`n` random 8x8 images of 2 channels and a per-pixel float target."""
  rng = np.random.default_rng(seed)
  return {"image": rng.normal(size=(n, 8, 8, 2)).astype(np.float32),
          "target": rng.normal(size=(n, 8, 8, 1)).astype(np.float32)}


def pixel_mse(model, batch):
  """The squared error per pixel, averaged over each image's pixels."""
  import jax.numpy as jnp
  error = model(batch["image"]).astype(jnp.float32) - batch["target"]
  return (error ** 2).reshape(error.shape[0], -1).mean(-1), {}


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("out")
  parser.add_argument("--steps", type=int, default=3)
  args = parser.parse_args(argv)
  cpu_devices.simulate(cpu_devices.requested([]) or 1)  # Before JAX first uses a device.
  import jax
  import jaxdp
  import user_models
  from jaxdp.configs import default
  saved = {}
  for name in MODELS:
    config = default.get_config()
    config.model.name = "mlp"  # Replaced by the object passed below.
    config.task.name = ""  # The task is the function passed below.
    config.batch_size, config.eval_batch_size, config.num_train_steps = 32, 8, args.steps
    config.learning_rate, config.log_every_steps, config.eval_every_steps = 1e-2, args.steps, args.steps
    config.checkpoint_every_steps = 0
    config.parallel.invariant, config.parallel.invariant_shards = True, 8
    with tempfile.TemporaryDirectory() as workdir:
      result = jaxdp.train_and_evaluate(config, workdir, model=getattr(user_models, name), task=pixel_mse,
                                        train_data=make_data(64, 0), eval_data=make_data(8, 1))
    for path, leaf in jax.tree_util.tree_leaves_with_path(result.params):
      saved[name + jax.tree_util.keystr(path)] = np.asarray(leaf)
  np.savez(args.out, **saved)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  main(sys.argv[1:])
