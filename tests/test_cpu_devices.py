"""CPU devices of one process: config.cpu_devices' choice, and the count a fresh process gets from "auto" (JAX's
own), from the key, and from the flag and XLA's option that win over it."""

import os
import subprocess
import sys

import pytest

from jaxdp.config import ConfigError
from jaxdp.configs import default
from jaxdp.runtime import cpu_devices

AUTO = cpu_devices.AUTO


def test_auto_is_jaxs_own_count():
  assert cpu_devices.choose(AUTO) is None  # No split per core: an XLA:CPU speed-up no accelerator run gets.


def test_a_count_in_the_config_is_taken_and_a_bad_one_named():
  assert cpu_devices.choose("3") == 3
  assert cpu_devices.choose(3) == 3  # An int from Python.
  for bad in ("0", "-1", True, "two", 1.5, ""):
    with pytest.raises(ConfigError, match=f"config.cpu_devices must be 'auto' or a positive integer, got {bad!r}"):
      cpu_devices.choose(bad)


COUNT = ("import sys; from jaxdp.tools import cli; from jaxdp.runtime import process; "
         "config, _ = cli.parse(sys.argv, require_workdir=False); process.init(config); import jax; "
         "print(jax.device_count())")


def _devices_of(*flags: str, **env: str) -> int:
  """The CPU device count a fresh process gets from the CLI's set-up with `flags` (default.py's config)."""
  clean = {k: v for k, v in os.environ.items() if k not in ("JAXDP_CPU_DEVICES", "XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  proc = subprocess.run([sys.executable, "-c", COUNT, "--config", default.__file__, *flags], capture_output=True,
                        text=True, timeout=120, env={**clean, "JAX_PLATFORMS": "cpu", **env})
  assert proc.returncode == 0, proc.stderr[-2000:]
  return int(proc.stdout.split()[-1])


def test_a_fresh_process_gets_the_choice_and_what_wins_over_it():
  assert _devices_of() == 1  # "auto": JAX's own, one CPU device, whatever the cores.
  assert _devices_of("--config.cpu_devices=3") == 3
  assert _devices_of("--config.cpu_devices=3", "--cpu_devices", "4") == 4  # The flag wins.
  assert _devices_of(XLA_FLAGS=f"{cpu_devices.DEVICE_COUNT_FLAG}=5") == 5  # XLA's own option wins.
  assert _devices_of("--config.cpu_devices=3", "--config.parallel.num_devices=1") == 1  # A run on N of JAX's own.


def test_invariant_mode_sizes_xla_s_thread_pool_as_for_its_most_devices():
  """max(PJRT_NPROC, else NPROC, else the cores; invariant_shards): no device count the mode allows changes it."""
  config = default.get_config()
  assert cpu_devices.pool_size(config, 2, {}) is None  # Plain DDP: XLA's own pool.
  config.parallel.invariant, config.parallel.invariant_shards = True, 8
  assert cpu_devices.pool_size(config, 2, {}) == 8
  assert cpu_devices.pool_size(config, 16, {}) == 16
  assert cpu_devices.pool_size(config, 2, {"NPROC": "12"}) == 12
  assert cpu_devices.pool_size(config, 2, {"PJRT_NPROC": "1", "NPROC": "12"}) == 8  # XLA reads PJRT_NPROC first.


def test_a_pool_size_a_parent_set_is_not_taken_for_the_users(monkeypatch):
  monkeypatch.setattr(cpu_devices, "backends_started", lambda: False)
  monkeypatch.setattr(cpu_devices, "_threads", cpu_devices._threads)
  monkeypatch.delenv("NPROC", raising=False)
  monkeypatch.setenv(cpu_devices.THREADS_ENV, "6")  # The user's own: kept, unless the shards need more.
  monkeypatch.delenv(cpu_devices.THREADS_ADDED, raising=False)
  config = default.get_config()
  config.parallel.invariant, config.parallel.invariant_shards = True, 4
  assert cpu_devices.fix_threads(config, 2) == 6 and cpu_devices.THREADS_ADDED not in os.environ
  config.parallel.invariant_shards = 8
  assert cpu_devices.fix_threads(config, 2) == 8 and os.environ[cpu_devices.THREADS_ADDED] == "8"
  config.parallel.invariant_shards = 2  # A child process with fewer shards: the parent's 8 was not the user's.
  assert cpu_devices.fix_threads(config, 1) == 2 and os.environ[cpu_devices.THREADS_ENV] == "2"
  config.parallel.invariant = False  # Plain DDP: XLA's own pool again.
  assert cpu_devices.fix_threads(config, 1) is None and cpu_devices.THREADS_ENV not in os.environ


def test_a_pool_jax_started_with_before_jaxdp_is_refused_where_it_differs(monkeypatch, caplog):
  """Here JAX started on 8 devices (conftest): its pool, max(cores, 8), serves 8 shards on up to 8 cores."""
  for name in (cpu_devices.THREADS_ENV, cpu_devices.THREADS_ENV_OLD):
    monkeypatch.delenv(name, raising=False)
  config = default.get_config()
  config.parallel.invariant, config.parallel.invariant_shards = True, 8
  assert cpu_devices.fix_threads(config, 2) is None and not caplog.records
  config.parallel.invariant_shards = 16
  with pytest.raises(ConfigError, match=r"thread pool at 8 threads, not 16, .* set PJRT_NPROC=16 before Python starts"):
    cpu_devices.fix_threads(config, 2)


def test_the_summary_line_names_where_the_count_came_from(monkeypatch):
  import jax
  count = jax.local_device_count()
  monkeypatch.setattr(cpu_devices, "_threads", "")
  monkeypatch.setattr(cpu_devices, "_chosen", count)
  chosen = f"{count}: config.cpu_devices={count}; --cpu_devices N or config.cpu_devices to choose"
  assert cpu_devices.describe() == chosen
  monkeypatch.setattr(cpu_devices, "_chosen", count + 1)  # Not the count JAX runs on: why none was set.
  monkeypatch.setattr(cpu_devices, "_left", "JAX's own")
  assert cpu_devices.describe() == f"{count}: JAX's own"
