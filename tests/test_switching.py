"""Python's GIL switch interval in the loop (`config.switch_interval_ms`, jaxdp.loop.switching): short inside the
loop, restored however the loop ends."""

import sys

import numpy as np
import pytest
from flax import nnx

import jaxdp
from jaxdp.config import ConfigError
from jaxdp.configs import default
from jaxdp.loop.switching import SwitchInterval


@pytest.fixture
def pythons_own():
  """Python's interval as the test found it, put back after."""
  was = sys.getswitchinterval()
  yield was
  sys.setswitchinterval(was)


def test_inside_the_interval_is_the_one_asked_for_and_after_it_is_the_one_found(pythons_own):
  with SwitchInterval(0.5):
    assert sys.getswitchinterval() == pytest.approx(0.0005)
  assert sys.getswitchinterval() == pythons_own


def test_it_is_restored_on_an_error(pythons_own):
  with pytest.raises(RuntimeError), SwitchInterval(0.25):
    raise RuntimeError("the loop failed")
  assert sys.getswitchinterval() == pythons_own


def test_zero_leaves_python_s_interval_alone(pythons_own):
  sys.setswitchinterval(0.003)
  with SwitchInterval(0):
    assert sys.getswitchinterval() == pytest.approx(0.003)
  assert sys.getswitchinterval() == pytest.approx(0.003)


class Rows:
  """A random-access source that notes the switch interval at each read (the prefetch thread's, in the loop)."""

  def __init__(self, n: int, seen: list[float]):
    rng = np.random.RandomState(0)
    self.x, self.y, self.seen = rng.randn(n, 4).astype(np.float32), rng.randn(n).astype(np.float32), seen

  def __len__(self) -> int:
    return len(self.x)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    self.seen.append(sys.getswitchinterval())
    return {"inputs": self.x[i], "labels": self.y[i]}


class Linear(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.linear = nnx.Linear(4, 1, rngs=rngs)

  def __call__(self, x):
    return self.linear(x)


def test_the_loop_runs_with_the_configured_interval_and_restores_python_s(tmp_path, pythons_own):
  config = default.get_config()
  config.batch_size, config.num_train_steps = 8, 12
  config.log_every_steps = config.eval_every_steps = 12
  config.checkpoint_every_steps = config.check_replicas_every_steps = 0
  config.best_metric, config.best_mode = "eval/mse", "min"
  config.parallel.block_mb = 0  # A read per step, inside the loop: blocks would read all steps before it.
  seen: list[float] = []
  jaxdp.train_and_evaluate(config, str(tmp_path), model=Linear, train_data=Rows(64, seen),
                           eval_data={"inputs": np.zeros((8, 4), np.float32), "labels": np.zeros(8, np.float32)})
  assert sys.getswitchinterval() == pythons_own
  assert pytest.approx(config.switch_interval_ms / 1000) in seen  # The loop's reads ran with it.


@pytest.mark.parametrize("value", [-1, -0.5, None])  # The float field casts True to 1.0 and refuses text.
def test_a_bad_value_is_a_config_error_naming_it(value):
  config = jaxdp.config.with_defaults(default.get_config())
  config.switch_interval_ms = value
  with pytest.raises(ConfigError, match="switch_interval_ms"):
    jaxdp.config.validate(config, 1, 1)
