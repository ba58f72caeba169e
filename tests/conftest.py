"""Eight simulated CPU devices for every test (through jax.config, before JAX first uses a device)."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import jax
import ml_collections
import pytest

from jaxdp.runtime import cpu_devices
from jaxdp import data
from jaxdp.configs import default

NUM_DEVICES = 8
cpu_devices.simulate(NUM_DEVICES)

# The suite's XLA flags, in this process and, through the environment, in every process it starts (a test that
# asks for others says so). The suite is bound by XLA:CPU's compiles, so it compiles for compile speed rather than
# run speed: LLVM at -O0 rather than XLA's default -O3 and, where this XLA still has them, XLA:CPU's loop emitters
# rather than its fusion emitters; together about 0.35-0.45 of -O1's compile seconds
# (benchmarks/README.md#the-test-suites-compiles). Their bits may differ from XLA's defaults in the last place, so
# processes whose numbers a test compares run with the same flags. Chosen once, by the first process to load this
# file (pytest-xdist's controller; its workers inherit them), before JAX starts its CPU backend, when XLA reads them.
COMPILE_FAST = "--xla_backend_optimization_level=0"
LOOP_EMITTERS = "--xla_cpu_use_fusion_emitters=false"  # XLA 0.11 and later refuse it: they have no other emitters.


def _xla_accepts(flags: str) -> bool:
  """Whether XLA starts with `flags` (it aborts on a flag it does not know): a fresh process tries."""
  probe = "import jax; jax.devices()"
  env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0


if "JAXDP_SUITE_XLA_FLAGS" not in os.environ:
  with_loops = f"{COMPILE_FAST} {LOOP_EMITTERS}"
  os.environ["JAXDP_SUITE_XLA_FLAGS"] = with_loops if _xla_accepts(with_loops) else COMPILE_FAST
XLA_FLAGS = os.environ["JAXDP_SUITE_XLA_FLAGS"]
os.environ["XLA_FLAGS"] = XLA_FLAGS

# One compilation cache for the session, inherited by the CLI and launcher subprocesses: many tests
# compile the same small programs, and a cache hit skips XLA (it changes no result: same executable).
# Made by the first process to load this file (pytest-xdist's controller); its workers inherit the variable.
# That process removes it at exit: each session's cache is tens of MB, so a left one fills /tmp run after run.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxdp-test-xla-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
_CACHE = {"jax_compilation_cache_dir": os.environ["JAX_COMPILATION_CACHE_DIR"],
          "jax_persistent_cache_min_compile_time_secs": 0.0, "jax_persistent_cache_min_entry_size_bytes": 0}
for _name, _value in _CACHE.items():
  os.environ.setdefault(_name.upper(), str(_value))  # For the subprocesses.
  jax.config.update(_name, type(_value)(os.environ[_name.upper()]))


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
  """Accepts pyproject's xdist options when xdist is off (`-p no:xdist`) or not installed: one process runs all."""
  if not pluginmanager.has_plugin("xdist"):
    parser.addoption("--numprocesses", default=None, help="ignored: pytest-xdist is not loaded")
    parser.addoption("--dist", default="no", help="ignored: pytest-xdist is not loaded")


@pytest.fixture(scope="session", autouse=True)
def _eight_devices() -> None:
  assert jax.device_count() == NUM_DEVICES, "a JAX device was used before conftest.py set the device count"


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
  """A TFDS data_dir with `digits` prepared once for the whole session (offline)."""
  path = str(tmp_path_factory.mktemp("tfds"))
  config = ml_collections.ConfigDict({"name": "digits", "data_dir": path})
  data.load(config)
  return path


@pytest.fixture(scope="session")
def tfrecord_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
  """`digits` prepared as TFRecord only (as `tfds build` does by default), which jaxdp refuses until converted.
  Read only: a test that converts it to ArrayRecord prepares its own."""
  import tensorflow_datasets as tfds

  from jaxdp.datasets import digits  # noqa: F401  (defining its builder registers "digits" with TFDS)
  path = str(tmp_path_factory.mktemp("tfrecord"))
  tfds.builder("digits", data_dir=path, file_format="tfrecord").download_and_prepare()
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
  # Checkpoints have their own tests; elsewhere they would only add seconds (a save) to every run.
  c.checkpoint_every_steps = 0
  return c
