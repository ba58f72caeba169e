"""Python's garbage collector in the loop (jaxdp.loop.collector): off inside the loop, young generations collected
every N steps, restored however the loop ends."""

import gc
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

import jaxdp
from jaxdp import feed
from jaxdp.configs import default
from jaxdp.loop import collector
from jaxdp.loop.collector import Collector


@pytest.fixture
def collections():
  """The generation of every collection from here on, in order."""
  seen = []

  def record(phase, info):
    if phase == "start":
      seen.append(info["generation"])
  gc.callbacks.append(record)
  yield seen
  gc.callbacks.remove(record)


def test_inside_automatic_collection_is_off_and_every_nth_step_collects_the_young_generations(collections):
  assert gc.isenabled()
  with Collector(3) as garbage:
    assert not gc.isenabled() and gc.get_freeze_count() > 0  # What existed before is left out of collections.
    for step in range(1, 8):
      before = len(collections)
      garbage.after(step)
      assert collections[before:] == ([1] if step % 3 == 0 else []), step
  assert gc.isenabled() and gc.get_freeze_count() == 0


def test_it_is_restored_on_an_error_and_leaves_a_disabled_collector_disabled():
  with pytest.raises(RuntimeError), Collector(5):
    raise RuntimeError("the loop failed")
  assert gc.isenabled() and gc.get_freeze_count() == 0
  gc.disable()
  try:
    with Collector(5):
      pass
    assert not gc.isenabled()  # The caller had it off: it stays off.
  finally:
    gc.enable()


def test_a_caller_s_frozen_objects_stay_frozen():
  gc.freeze()
  try:
    frozen = gc.get_freeze_count()
    with Collector(5):
      pass
    assert gc.get_freeze_count() >= frozen > 0
  finally:
    gc.unfreeze()


def test_objects_frozen_before_jaxdp_started_are_not_a_caller_s():
  """CPython 3.12.1 starts with objects frozen (3.10, 3.11, 3.13 with none): here a fresh interpreter that froze its
  heap before importing jaxdp, as 3.12.1 does before running anything. The loop still unfreezes what it froze."""
  code = ("import gc; gc.freeze()\n"
          "from jaxdp.loop.collector import Collector\n"
          "with Collector(5):\n"
          "  made = [[] for _ in range(1000)]\n"
          "print(gc.get_freeze_count())")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr
  assert int(result.stdout) == 0  # Else every train_and_evaluate leaves the whole heap frozen for good.


def test_zero_leaves_python_s_automatic_collection_alone(collections):
  frozen = gc.get_freeze_count()  # As the interpreter started, or as the tests before left it.
  with Collector(0) as garbage:
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    garbage.after(0)
  assert collections == []


class Rows:
  """A random-access source that notes whether automatic collection was on at each read."""

  def __init__(self, n: int, enabled: list[bool]):
    rng = np.random.RandomState(0)
    self.x, self.y, self.enabled = rng.randn(n, 4).astype(np.float32), rng.randn(n).astype(np.float32), enabled

  def __len__(self) -> int:
    return len(self.x)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    self.enabled.append(gc.isenabled())
    return {"inputs": self.x[i], "labels": self.y[i]}


class Linear(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.linear = nnx.Linear(4, 1, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.linear(x)


@pytest.mark.parametrize("every", [4, 0])
def test_the_loop_trains_with_automatic_collection_off_and_restores_it(tmp_path, collections, every, monkeypatch):
  monkeypatch.setattr(collector, "EVERY_STEPS", every)
  config = default.get_config()
  config.batch_size, config.num_train_steps = 8, 40
  config.log_every_steps = config.eval_every_steps = 40
  config.checkpoint_every_steps = 0
  config.best_metric, config.best_mode = "eval/mse", "min"
  monkeypatch.setattr(feed, "BLOCK_MIB", 0)  # A read per step, inside the loop: blocks would read all 40 steps before it.
  enabled: list[bool] = []
  jaxdp.train_and_evaluate(config, str(tmp_path), model=Linear, train_data=Rows(64, enabled),
                           eval_data={"inputs": np.zeros((8, 4), np.float32), "labels": np.zeros(8, np.float32)})
  # No more frozen than when jaxdp started: CPython 3.12.1 starts with objects frozen, and a full collection freezes
  # them again after an unfreeze.
  assert gc.isenabled() and gc.get_freeze_count() <= jaxdp._FROZEN_AT_START
  if every:
    assert False in enabled and collections.count(1) >= 40 // every  # The loop's reads ran with it off.
  else:
    assert all(enabled)

