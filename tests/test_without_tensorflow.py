"""Runs with nothing to decode never load TensorFlow (seconds of every process's start): the train order and the
augmentation draws are numpy's, the features' numpy dtypes, TensorBoard files written without `tf.io.gfile`."""

import os
import subprocess
import sys
import textwrap

import numpy as np

import runs
from jaxdp import train

REPORT = "tensorflow modules loaded:"


def _loaded(code: str) -> list[str]:
  """The TensorFlow modules a fresh process running `code` has loaded when it exits (atexit: the CLI's exit
  skips the interpreter's teardown but runs atexit's handlers)."""
  prologue = ("import atexit, sys\n"
              f"atexit.register(lambda: print({REPORT!r}, sorted(m for m in sys.modules "
              "if m.split('.')[0] == 'tensorflow')[:5], flush=True))\n")
  done = subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)], capture_output=True, text=True,
                        timeout=300, env={**os.environ, "JAXDP_CPU_DEVICES": "2"})
  assert done.returncode == 0, done.stdout + done.stderr
  line = next(line for line in done.stdout.splitlines() if line.startswith(REPORT))
  return eval(line[len(REPORT):])


def test_a_second_run_on_a_cached_split_loads_no_tensorflow(config, tmp_path):
  config.checkpoint_every_steps = 4  # A checkpoint and TensorBoard files too: nothing of a run's own loads TF.
  train.train_and_evaluate(config, str(tmp_path / "first"))  # Decodes `digits` (TF) and keeps it on disk.
  args = runs.flags({"dataset.data_dir": config.dataset.data_dir, "model.name": "mlp", "num_train_steps": 4,
                     "batch_size": 32, "eval_every_steps": 4, "checkpoint_every_steps": 4})
  assert _loaded(f"""
      import runpy
      sys.argv = ["jaxdp.train", *{args!r}, "--workdir", {str(tmp_path / "second")!r}]
      runpy.run_module("jaxdp.train", run_name="__main__")
      """) == []
  assert (tmp_path / "second" / "metrics.jsonl").exists() and list((tmp_path / "second").glob("events.out.*"))


def test_a_run_on_in_memory_arrays_loads_no_tensorflow(tmp_path):
  assert _loaded(f"""
      import numpy as np
      import jaxdp
      from jaxdp.configs import default
      config = default.get_config()
      config.num_train_steps, config.batch_size, config.eval_every_steps = 4, 16, 4
      rng = np.random.RandomState(0)
      arrays = lambda n: {{"inputs": rng.rand(n, 8, 8, 1).astype(np.float32), "labels": rng.randint(0, 10, n)}}
      jaxdp.train_and_evaluate(config, {str(tmp_path / "run")!r}, train_data=arrays(64), eval_data=arrays(32))
      """) == []
