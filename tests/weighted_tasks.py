"""A user's weighted task, model and data: per-example weights from a feature, heavily skewed, 30% of them zero."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from sklearn.datasets import load_digits

from jaxdp.tasks import Metric


def weighted(model, batch: dict[str, jax.Array]) -> tuple[Metric, dict]:
  """Cross-entropy weighted by `batch["weight"]` (as a padding mask, a token count or an ignored label gives it)."""
  logits = model(batch["inputs"]).astype(jnp.float32)
  ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["labels"][:, None], -1)[:, 0]
  w = batch["weight"]
  return Metric(ce, weights=w), {"accuracy": Metric(jnp.argmax(logits, -1) == batch["labels"], weights=w)}


class MLP(nnx.Module):
  """A user's MLP: nnx.Linear, ReLU, nnx.Linear."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(64, 32, rngs=rngs)
    self.out = nnx.Linear(32, 10, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.out(nnx.relu(self.hidden(x)))


def arrays(n: int = 512, seed: int = 0) -> dict[str, np.ndarray]:
  """`n` digits with weights: 30% zero, the rest log-normal (a few rows weigh a hundred times the median)."""
  digits = load_digits()
  rng = np.random.RandomState(seed)
  rows = rng.permutation(len(digits.target))[:n]
  weight = np.exp(2.0 * rng.randn(n)).astype(np.float32)
  weight[rng.rand(n) < 0.3] = 0.0
  return {"inputs": (digits.data[rows] / 16.0).astype(np.float32), "labels": digits.target[rows].astype(np.int32),
          "weight": weight}


def loss_by_hand(params: dict, batch: dict[str, np.ndarray]) -> float:
  """Σ w·ℓ / Σ w of `MLP`'s cross-entropy on `batch`, in float64 numpy."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  h = np.maximum(batch["inputs"] @ p["hidden"]["kernel"] + p["hidden"]["bias"], 0)
  logits = h @ p["out"]["kernel"] + p["out"]["bias"]
  log_p = logits - logits.max(-1, keepdims=True)
  log_p = log_p - np.log(np.exp(log_p).sum(-1, keepdims=True))
  ce = -log_p[np.arange(len(logits)), batch["labels"]]
  w = batch["weight"].astype(np.float64)
  return float((w * ce).sum() / w.sum())


def config(steps: int = 25):
  """The runs' config: SGD at a rate that moves the parameters far in `steps` steps, a loss logged every step."""
  from jaxdp.configs import default
  c = default.get_config()
  c.model.name = "mlp"  # Replaced by `MLP`; the config's other model fields stay out.
  c.optimizer, c.learning_rate, c.batch_size, c.eval_batch_size = "sgd", 0.5, 64, 64
  c.num_train_steps, c.log_every_steps, c.eval_every_steps = steps, 1, steps
  c.checkpoint_every_steps = 0
  return c


def train(config, workdir: str, data: dict[str, np.ndarray] | None = None, task=None):
  """`jaxdp.train_and_evaluate` of `task` (default `weighted`) with `MLP` on `data` (default `arrays()`), train and eval."""
  import jaxdp
  data = arrays() if data is None else data
  return jaxdp.train_and_evaluate(config, workdir, model=MLP, task=task or weighted, train_data=data, eval_data=data)


def scaled(model, batch: dict[str, jax.Array], factor: float = 1e-8) -> tuple[Metric, dict]:
  """`weighted` times `factor`: at 1e-8 float16's gradients underflow unless the loss is scaled; at 0.01 the scaled
  ones overflow until the scale comes down."""
  loss, metrics = weighted(model, batch)
  return Metric(loss.values * factor, weights=loss.weights), metrics


def main(argv: list[str]) -> None:
  """Under `jaxdp.launch ... -- tests/weighted_tasks.py WORKDIR` (or alone): trains; process 0 saves final.npz."""
  import argparse
  import os
  from jaxdp.runtime import cpu_devices
  parser = argparse.ArgumentParser()
  parser.add_argument("workdir")
  parser.add_argument("--steps", type=int, default=25)
  parser.add_argument("--float16", type=float, default=0, help="float16 compute, the loss times this factor.")
  parser.add_argument("--checkpoint_every", type=int, default=0)
  args = parser.parse_args(argv)
  cpu_devices.simulate(cpu_devices.requested([]) or 1)  # Before JAX first uses a device.
  c = config(args.steps)
  c.checkpoint_every_steps = args.checkpoint_every
  task = weighted
  if args.float16:
    c.dtype, c.task.factor, c.learning_rate, task = "float16", args.float16, 0.2 / args.float16, scaled
  result = train(c, args.workdir, task=task)
  if jax.process_index() == 0:
    state = result.backend.get({"params": result.state.params, "loss_scale": result.state.loss_scale})
    flat = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(state)}
    np.savez(os.path.join(args.workdir, "final.npz"), **flat)


if __name__ == "__main__":
  import sys
  main(sys.argv[1:])
