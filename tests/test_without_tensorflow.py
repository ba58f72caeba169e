"""Runs with nothing to decode never load TensorFlow (seconds of every process's start): the train order's numpy
twin of TF's stateless ops (`jaxdp.data.philox`, bitwise TF's), the features' numpy dtypes, TensorBoard files
written without `tf.io.gfile`."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import runs
from jaxdp import train
from jaxdp.data import philox

SEEDS = [(0, 0), (1, 2), (-1, 5), (2**63 - 1, -2**63), (3, 1), *[tuple(int(v) for v in pair) for pair in
         np.random.default_rng(0).integers(-2**63, 2**63 - 1, size=(6, 2), dtype=np.int64)]]
REPORT = "tensorflow modules loaded:"


@pytest.mark.parametrize("seed", SEEDS)
def test_fold_in_is_tfs(seed):
  for data in (0, 1, 7, -3, 2**40):
    want = tf.random.experimental.stateless_fold_in(tf.constant(seed, tf.int64), tf.constant(data, tf.int64))
    np.testing.assert_array_equal(philox.fold_in(seed, data), want.numpy())
  steps = np.arange(-2, 70)  # Many at once, as `HostDraws` folds a block of steps in.
  want = [tf.random.experimental.stateless_fold_in(tf.constant(seed, tf.int64), s).numpy() for s in steps]
  np.testing.assert_array_equal(philox.fold_in(seed, steps), want)


@pytest.mark.parametrize("seed", SEEDS)
def test_shuffle_is_tfs(seed):
  for n in [*range(0, 40), 255, 256, 257, 1797, 70_001]:
    want = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), tf.constant(seed, tf.int64))
    np.testing.assert_array_equal(philox.shuffle(n, seed), want.numpy(), err_msg=f"n={n}")


def test_shuffle_drawn_in_chunks_is_tfs(monkeypatch):
  monkeypatch.setattr(philox, "DRAW_CHUNK", 12)  # Chunk edges inside the draws of every size below.
  for seed in SEEDS[:4]:
    for n in (2, 13, 14, 25, 100, 1797):
      want = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), tf.constant(seed, tf.int64))
      np.testing.assert_array_equal(philox.shuffle(n, seed), want.numpy(), err_msg=f"n={n}")


@pytest.mark.parametrize("keyed", [True, False])
@pytest.mark.parametrize("pattern", ["random", "none", "all_to_the_end", "each_to_the_next"])
def test_swapped_is_the_swaps_done_in_turn(pattern, keyed, monkeypatch):
  """The closed form of the shuffle's swaps (`philox.swapped`) against doing them one by one, on targets TF's
  draws rarely make: chains of swaps through one position, and none at all; also as splits over KEYED_MAX sort."""
  if not keyed:
    monkeypatch.setattr(philox, "KEYED_MAX", 0)
  rng = np.random.default_rng(0)
  for n in [2, 3, 5, 64, 1000]:
    steps = np.arange(n - 1)
    targets = {"random": steps + rng.integers(0, n - steps), "none": steps, "all_to_the_end": np.full(n - 1, n - 1),
               "each_to_the_next": steps + 1}[pattern]
    order = list(range(n))
    for i, j in enumerate(targets.tolist()):
      order[i], order[j] = order[j], order[i]
    np.testing.assert_array_equal(philox.swapped(targets.astype(np.int64)), order, err_msg=f"n={n}")


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
