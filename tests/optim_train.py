"""A user's script with an optax optimizer object (a clipped Lion under a warmup-cosine schedule) on `digits`.

    python tests/optim_train.py WORKDIR DATA_DIR STEPS

Its devices: JAXDP_CPU_DEVICES. Checkpoints every 8 steps; writes the final parameters to WORKDIR/final.npz.
"""

import os
import sys

import jax
import numpy as np
import optax

import jaxdp
from jaxdp.configs import default


def main(workdir: str, data_dir: str, steps: int) -> None:
  config = default.get_config()
  config.dataset.data_dir, config.model.name, config.model.hidden = data_dir, "mlp", (32,)
  config.batch_size, config.num_train_steps, config.cpu_devices = 32, steps, "1"
  config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps = 8, steps, 8
  schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 4, 40)
  result = jaxdp.train_and_evaluate(config, workdir, optimizer=optax.chain(optax.clip_by_global_norm(1.0),
                                                                           optax.lion(schedule)))
  flat = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(result.params)}
  np.savez(os.path.join(workdir, "final.npz"), devices=jax.device_count(), **flat)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
