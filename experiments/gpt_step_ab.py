"""jaxdp's compiled train step against the plain-JAX loop's, on the four-way study's small GPT, in one process.

    python experiments/gpt_step_ab.py [--rounds 10] [--repeats 10] [--block_mb 0] [--tmp /tmp/gpt_step_ab]

Both steps run the same model, optimizer and batch: jaxdp's `build.build(...).feed.train_step` on a device batch
(or block) from its own pipeline, and four_way_jax.py's jit step (value_and_grad, optax update) from jaxdp's init
state. Rounds alternate the order (A B, B A, ...); each times `--repeats` calls, process CPU seconds (all threads)
and wall. Prints medians (min..max) and the per-round ratio plain / jaxdp (> 1: jaxdp faster). What the loop adds
around the step (input, host work) is four_way.py's split; this is the step alone. Results: gpt_step_parts.md.
"""

import argparse
import os
import sys
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abrun  # noqa: E402
import four_way_configs  # noqa: E402
import four_way_jax  # noqa: E402


def jaxdp_step(tmp: str, block_mb: float) -> Callable[[int], None]:
  """`run(n)`: n of jaxdp's train steps on one placed batch (or block), waited for."""
  path = os.path.join(tmp, "text.txt")
  if not os.path.exists(path):
    os.makedirs(tmp, exist_ok=True)
    with open(path, "w") as f:  # Printable bytes: any text file trains the same shapes.
      f.write("".join(map(chr, np.random.default_rng(0).integers(32, 127, 300_000))))
  config = four_way_configs.get_config("gpt")
  config.dataset.builder_kwargs.path, config.dataset.data_dir = path, os.path.join(tmp, "tfds")
  config.num_train_steps, config.parallel.block_mb = 400, block_mb
  return abrun.jaxdp_stepping(config)


def plain_step() -> Callable[[int], None]:
  """`run(n)`: n of the plain-JAX loop's steps (four_way_jax.py's) from jaxdp's init state, waited for."""
  import jax
  import jax.numpy as jnp
  import optax

  from jaxdp import models
  from jaxdp import step as step_lib
  config = four_way_configs.get_config("gpt")
  config.num_train_steps = 400
  model = models.get_model(config.model, (config.dataset.builder_kwargs.seq_len,), 256)
  tx, loss_fn = four_way_jax.tx_of(config), four_way_jax.loss_of(model)

  def step(state, inputs, labels):
    params, model_state, opt_state = state
    (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, model_state, inputs, labels)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), model_state, opt_state), loss

  step = jax.jit(step, donate_argnums=0)
  fresh = step_lib.init_state(jax.random.PRNGKey(config.seed), model=model, tx=tx)
  state = (fresh.params, fresh.model_state, tx.init(fresh.params))
  shape = (config.batch_size, config.dataset.builder_kwargs.seq_len)
  tokens = np.random.default_rng(0).integers(0, 256, (2, *shape))
  x, y = jnp.asarray(tokens[0], jnp.float32), jnp.asarray(tokens[1], jnp.int32)

  return abrun.stepping(step, state, x, y)


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--block_mb", type=float, default=0.0, help="jaxdp's parallel.block_mb (0: a batch a step).")
  parser.add_argument("--tmp", default="/tmp/gpt_step_ab", help="The text file and its TFDS preparation.")
  args = parser.parse_args(argv)
  sides = {"jaxdp": jaxdp_step(args.tmp, args.block_mb), "plain": plain_step()}
  times = abrun.cpu_wall(sides, args.rounds, args.repeats)
  print(f"load {os.getloadavg()[0]:.1f}; {args.rounds} rounds x {args.repeats} calls; ms per step")
  print("\n".join(abrun.cpu_wall_lines(times, "plain", "jaxdp")))

if __name__ == "__main__":
  main(sys.argv[1:])
