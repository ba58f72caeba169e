"""Eight fake CPU devices for every test; they must be set before JAX is imported."""

import os
import tempfile

os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    + ["--xla_force_host_platform_device_count=8"])
os.environ["JAX_PLATFORMS"] = "cpu"
# One compilation cache for the session, inherited by the CLI and launcher subprocesses: many tests
# compile the same small programs, and a cache hit skips XLA (it changes no result: same executable).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="jaxdp-test-xla-cache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import ml_collections  # noqa: E402
import pytest  # noqa: E402

from jaxdp import data  # noqa: E402
from jaxdp.configs import default  # noqa: E402

NUM_DEVICES = 8


@pytest.fixture(scope="session", autouse=True)
def _eight_devices() -> None:
  assert jax.device_count() == NUM_DEVICES, "XLA_FLAGS was applied after JAX was imported"


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
  """A TFDS data_dir with `digits` prepared once for the whole session (offline)."""
  path = str(tmp_path_factory.mktemp("tfds"))
  config = ml_collections.ConfigDict({"name": "digits", "data_dir": path})
  data.load(config)
  return path


@pytest.fixture
def config(data_dir: str) -> ml_collections.ConfigDict:
  """A tiny, fast config on `digits`: small MLP, few steps, no periodic eval."""
  c = default.get_config()
  c.dataset.data_dir = data_dir
  c.model.name = "mlp"
  c.model.hidden = (32,)
  c.batch_size = 32
  c.num_train_steps = 4
  c.log_every_steps = 2
  c.eval_every_steps = 1000
  # Checkpoints and the replica sentinel have their own tests; elsewhere they would only add seconds
  # (a save, a compile) to every run.
  c.checkpoint_every_steps = 0
  c.check_replicas_every_steps = 0
  return c
