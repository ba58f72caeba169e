"""The process's edges from a user's script: CPU devices asked for after a JAX call."""

import os
import subprocess
import sys

from jaxdp.runtime import cpu_devices

SCRIPT = "import jax, jaxdp; jax.numpy.zeros(1); print('devices', jaxdp.DataParallel().num_devices)"


def _script(**env: str) -> subprocess.CompletedProcess:
  clean = {k: v for k, v in os.environ.items() if k not in (cpu_devices.ENV_VAR, "XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                        env={**clean, "JAX_PLATFORMS": "cpu", **env})


def test_jaxdp_cpu_devices_after_a_jax_call_names_what_was_set_and_what_works():
  """The error names the variable the user set (not a flag never passed), and its advice works as written."""
  late = _script(JAXDP_CPU_DEVICES="4")
  last = late.stderr.strip().splitlines()[-1]
  assert late.returncode == 1 and "devices" not in late.stdout, late.stderr[-2000:]
  advice = f"XLA_FLAGS={cpu_devices.DEVICE_COUNT_FLAG}=4"
  assert last.startswith("jaxdp.config.ConfigError: JAXDP_CPU_DEVICES=4 comes too late") and advice in last, last
  followed = _script(JAXDP_CPU_DEVICES="4", XLA_FLAGS=advice.split("=", 1)[1])
  assert followed.returncode == 0 and followed.stdout.split() == ["devices", "4"], followed.stderr[-2000:]
