"""A user's script with hooks: early stopping on eval/loss and a hook recording what it saw, every process.

    python -m jaxdp.launch --num_processes 2 --devices_per_process 1 -- tests/hook_train.py WORKDIR DATA_DIR

Each process writes WORKDIR/hooks_<process>.json: its result's `stopped_at`, the steps its `every=3` hook ran
at, and the eval metrics its `on_eval` saw.
"""

import json
import os
import sys

from jaxdp.runtime import cpu_devices

EVERY = 3


def main(workdir: str, data_dir: str) -> None:
  cpu_devices.simulate(cpu_devices.requested([]) or 1)  # Before JAX first uses a device.
  import jax

  import jaxdp
  from jaxdp.configs import default
  config = default.get_config()
  config.dataset.data_dir, config.model.name, config.model.hidden = data_dir, "mlp", (32,)
  config.batch_size, config.num_train_steps, config.log_every_steps, config.eval_every_steps = 32, 40, 1, 2
  config.checkpoint_every_steps = 0  # The stop's checkpoint is the only one.
  seen: dict = {"steps": [], "evals": {}}

  class Recorder(jaxdp.Hook):
    every = EVERY

    def on_step(self, info: jaxdp.StepInfo) -> None:
      seen["steps"].append(info.step)

    def on_eval(self, info: jaxdp.StepInfo) -> None:
      seen["evals"][info.step] = dict(info.metrics)

  # No eval improves on the first by 1e9: the run stops at the second eval after it (step 6).
  stopping = jaxdp.EarlyStopping("eval/loss", mode="min", patience=2, min_delta=1e9)
  result = jaxdp.train_and_evaluate(config, workdir, hooks=[Recorder(), stopping])
  with open(os.path.join(workdir, f"hooks_{jax.process_index()}.json"), "w") as f:
    json.dump({"stopped_at": result.stopped_at, **seen}, f)


if __name__ == "__main__":
  main(*sys.argv[1:])
