"""XLA:CPU's flags: the choice on made-up machines, the user's XLA_FLAGS winning, the override key, and the
flags reaching XLA in a `python -m jaxdp.train` process."""

import glob
import os
import re
import subprocess
import sys

import ml_collections
import pytest

from jaxdp.config import ConfigError
from jaxdp.runtime import xla_cpu

AVX2 = frozenset({"sse4_2", "fma", "avx2"})
EPYC = xla_cpu.Machine("x86_64", AVX2, 2, 1)  # The kind the choice was measured on.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(setting: str = xla_cpu.AUTO) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({xla_cpu.KEY: setting})


def test_avx2_without_avx512_on_few_cores_keeps_xlas_defaults_as_measured():
  """One process: no flag set was faster for every workload there (experiments/xla_cpu_defaults.md)."""
  assert xla_cpu.choose(EPYC).flags == ()
  assert xla_cpu.choose(xla_cpu.Machine("x86_64", AVX2, 1, 1)).flags == ()
  assert xla_cpu.MEASURED in xla_cpu.choose(EPYC).why and "measured on AVX2" in xla_cpu.choose(EPYC).why


@pytest.mark.parametrize("cores,processes", [(2, 2), (1, 2), (2, 4)])
def test_processes_sharing_the_cores_keep_the_one_process_kernels_and_are_told_of_onednn(cores, processes):
  """oneDNN's dots are faster for dense layers there (experiments/dense_parts.md), but flags chosen by process
  count would make 2 processes differ from 1 in the last bits, and resume on another count would not be bitwise."""
  choice = xla_cpu.choose(xla_cpu.Machine("x86_64", AVX2, cores, processes))
  assert choice.flags == xla_cpu.choose(xla_cpu.Machine("x86_64", AVX2, cores, 1)).flags == ()
  assert " ".join(xla_cpu.ONEDNN_DOTS) in choice.why and xla_cpu.MEASURED in choice.why


def test_processes_with_several_cores_each_keep_xlas_defaults():
  assert xla_cpu.choose(xla_cpu.Machine("x86_64", AVX2, 2, 1)).flags == ()
  assert xla_cpu.choose(xla_cpu.Machine("x86_64", AVX2 | {"avx512f"}, 2, 2)).flags == ()
  assert xla_cpu.choose(xla_cpu.Machine("x86_64", AVX2, 64, 64)).flags == ()  # Not measured.


@pytest.mark.parametrize("processes", [1, 2])
def test_avx512_on_few_cores_keeps_xlas_defaults_as_measured(processes):
  """Zen 4 and Zen 5 with AVX-512: no flag set was faster for every workload either (xla_cpu_defaults.md, Runs 5
  and 6)."""
  choice = xla_cpu.choose(xla_cpu.Machine("x86_64", AVX2 | {"avx512f"}, 2, processes))
  assert choice.flags == () and "measured on AVX-512" in choice.why and xla_cpu.MEASURED in choice.why
  assert "not measured on more" in xla_cpu.choose(xla_cpu.Machine("x86_64", AVX2 | {"avx512f"}, 64, 1)).why


@pytest.mark.parametrize("machine", [
    xla_cpu.Machine("x86_64", AVX2 | {"avx512f"}, 64, 1),  # AVX-512 on many cores: not measured.
    xla_cpu.Machine("aarch64", frozenset({"asimd", "sve"}), 2, 1),  # ARM: not measured.
    xla_cpu.Machine("x86_64", AVX2, 64, 1),  # Many cores: not measured.
    xla_cpu.Machine("x86_64", frozenset({"sse4_2"}), 2, 1),  # No AVX2.
    xla_cpu.Machine("x86_64", frozenset(), 2, 1),  # Flags unknown (not Linux).
], ids=["avx512_64_cores", "arm", "64_cores", "no_avx2", "unknown"])
def test_an_unmeasured_machine_keeps_xlas_defaults(machine):
  choice = xla_cpu.choose(machine)
  assert choice.flags == () and "XLA's defaults" in choice.why


def test_the_config_key_overrides_the_choice():
  assert xla_cpu.choose(EPYC, "").flags == ()
  assert xla_cpu.choose(EPYC, "--xla_cpu_multi_thread_eigen=false --xla_cpu_enable_fast_math=false").flags == (
      "--xla_cpu_multi_thread_eigen=false", "--xla_cpu_enable_fast_math=false")
  with pytest.raises(ConfigError, match="xla_cpu_flags.*'fast'"):
    xla_cpu.choose(EPYC, "fast")


def test_the_default_config_asks_for_the_automatic_choice():
  from jaxdp import config as config_lib
  assert config_lib.with_defaults(ml_collections.ConfigDict())[xla_cpu.KEY] == xla_cpu.AUTO


def test_a_flag_the_users_xla_flags_set_is_kept():
  flags, added, kept = xla_cpu.merge("--xla_cpu_experimental_ynn_fusion_type= --xla_dump_to=/tmp/d",
                                     (xla_cpu.NO_YNN_CONVOLUTIONS, "--xla_cpu_multi_thread_eigen=false"))
  assert flags == ("--xla_cpu_experimental_ynn_fusion_type= --xla_dump_to=/tmp/d "
                   "--xla_cpu_multi_thread_eigen=false")
  assert added == ("--xla_cpu_multi_thread_eigen=false",) and kept == (xla_cpu.NO_YNN_CONVOLUTIONS,)
  flag = xla_cpu.NO_YNN_CONVOLUTIONS
  assert xla_cpu.merge("", (flag,)) == (flag, (flag,), ())


def test_apply_sets_xla_flags_before_jax_starts(monkeypatch):
  monkeypatch.setattr(xla_cpu, "backends_started", lambda: False)
  monkeypatch.setattr(xla_cpu, "_outcome", None)
  monkeypatch.setenv(xla_cpu.ENV, "--xla_dump_to=/tmp/d --xla_cpu_experimental_ynn_fusion_type=dot")
  outcome = xla_cpu.apply(_config("--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_multi_thread_eigen=false"))
  assert os.environ[xla_cpu.ENV] == ("--xla_dump_to=/tmp/d --xla_cpu_experimental_ynn_fusion_type=dot "
                                     "--xla_cpu_multi_thread_eigen=false")
  assert "XLA_FLAGS sets --xla_cpu_experimental_ynn_fusion_type (kept)" in xla_cpu.describe(outcome)
  monkeypatch.delenv(xla_cpu.ENV)
  xla_cpu.apply(_config(""))  # XLA's defaults: nothing to add, and no empty XLA_FLAGS made up.
  assert xla_cpu.ENV not in os.environ
  xla_cpu.apply(_config(xla_cpu.NO_YNN_CONVOLUTIONS), EPYC)
  assert os.environ[xla_cpu.ENV] == xla_cpu.NO_YNN_CONVOLUTIONS
  assert xla_cpu.describe().startswith(f"xla_cpu_flags='{xla_cpu.NO_YNN_CONVOLUTIONS}'")


def test_flags_jaxdp_added_before_are_not_taken_for_the_users(monkeypatch):
  """A second apply (the CLI's start-up, then train_and_evaluate's; or a child process) sees its own flags."""
  monkeypatch.setattr(xla_cpu, "backends_started", lambda: False)
  monkeypatch.setattr(xla_cpu, "_outcome", None)
  monkeypatch.setenv(xla_cpu.ENV, "--xla_dump_to=/tmp/d")
  monkeypatch.delenv(xla_cpu.ENV_ADDED, raising=False)
  xla_cpu.apply(_config(xla_cpu.NO_YNN_CONVOLUTIONS), EPYC)
  outcome = xla_cpu.apply(_config(xla_cpu.NO_YNN_CONVOLUTIONS), EPYC)
  assert os.environ[xla_cpu.ENV] == f"--xla_dump_to=/tmp/d {xla_cpu.NO_YNN_CONVOLUTIONS}"
  assert outcome.users == () and "(kept)" not in xla_cpu.describe(outcome)
  xla_cpu.apply(_config(""), EPYC)  # A later choice of XLA's defaults takes jaxdp's own flag back out.
  assert os.environ[xla_cpu.ENV] == "--xla_dump_to=/tmp/d"


def test_after_jax_started_the_summary_says_the_flags_were_not_applied(monkeypatch):
  monkeypatch.setattr(xla_cpu, "_outcome", None)
  monkeypatch.delenv(xla_cpu.ENV, raising=False)
  outcome = xla_cpu.apply(_config(xla_cpu.NO_YNN_CONVOLUTIONS), EPYC)  # conftest.py's devices: JAX has started.
  assert outcome.too_late and xla_cpu.ENV not in os.environ
  expected = f"not applied: JAX had started before jaxdp (set XLA_FLAGS='{xla_cpu.NO_YNN_CONVOLUTIONS}'"
  assert expected in xla_cpu.describe()


def _ynn_ops(tmp_path, name: str, *overrides: str) -> set[str]:
  """The ops (convolution, dot, reduce) XLA ran in YNNPACK in a one-step `python -m jaxdp.train` of the default
  config (a CNN)."""
  return set().union(*(_ops_in_ynn(hlo) for hlo in _train_step_hlo(tmp_path, name, *overrides)))


def _train_step_hlo(tmp_path, name: str, *overrides: str) -> list[str]:
  """The optimised HLO of the train step of a one-step `python -m jaxdp.train` of the default config (a CNN)."""
  dump = tmp_path / name
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "JAXDP_CPU_DEVICES")}
  env.update({"XLA_FLAGS": f"--xla_dump_to={dump}", "JAX_PLATFORMS": "cpu"})  # A cache hit would dump nothing.
  proc = subprocess.run([sys.executable, "-m", "jaxdp.train", "--config", "jaxdp/configs/default.py",
                         "--workdir", str(tmp_path / f"{name}_run"), "--config.num_train_steps=1",
                         "--config.checkpoint_every_steps=0", "--config.compilation_cache_dir=", *overrides],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  texts = glob.glob(str(dump / "*train_step*after_optimizations.txt"))  # What experiments/xla_cpu_defaults measured.
  assert texts, f"no HLO dumped in {dump}"
  return [open(p).read() for p in texts]


def _ops_in_ynn(hlo: str) -> set[str]:
  """The ops among convolution, dot and reduce that the computations YNNPACK fusions call hold (XLA's own stand
  outside one)."""
  called = re.findall(r'calls=%([\w.-]+).*"kind":"__ynn_fusion"', hlo)
  blocks = {b.split(" ", 1)[0].lstrip("%"): b for b in map(str.strip, hlo.split("\n\n")) if b.startswith("%")}
  return {op for name in called for op in ("convolution", "dot", "reduce") if f" {op}(" in blocks.get(name, "")}


def test_the_flags_reach_xla_in_a_train_process(tmp_path):
  """The automatic choice (on this machine) and the override reach XLA: YNNPACK's convolutions in the compiled HLO."""
  machine = xla_cpu.this_machine()
  if not (machine.arch == "x86_64" and "avx2" in machine.isa):
    pytest.skip("YNNPACK fuses on x86 with AVX2; elsewhere XLA's defaults may fuse nothing into it")
  # XLA's default list: individual_dot, individual_convolution, reduce.
  assert _ynn_ops(tmp_path, "defaults", f"--config.{xla_cpu.KEY}=") == {"convolution", "dot", "reduce"}
  auto = _ynn_ops(tmp_path, "auto")
  assert ("convolution" in auto) == (xla_cpu.NO_YNN_CONVOLUTIONS not in xla_cpu.choose(machine).flags)
  assert not _ynn_ops(tmp_path, "explicit", f"--config.{xla_cpu.KEY}=--xla_cpu_experimental_ynn_fusion_type=")
  # The opt-in moves the convolutions only: YNNPACK's reductions are worth 8% of the GPT's step (xla_cpu_defaults.md).
  assert _ynn_ops(tmp_path, "opt_in", f"--config.{xla_cpu.KEY}={xla_cpu.NO_YNN_CONVOLUTIONS}") == {"dot", "reduce"}
  onednn = _train_step_hlo(tmp_path, "onednn", f"--config.{xla_cpu.KEY}={' '.join(xla_cpu.ONEDNN_DOTS)}")
  assert any('"kind":"__onednn_fusion"' in hlo for hlo in onednn)  # Both flags, this jaxlib's names: dots in oneDNN.


def test_whether_jax_started_is_asked_of_its_private_api_and_a_jax_without_it_reads_not_started(monkeypatch):
  import jax
  from jax._src import xla_bridge
  jax.devices()  # This test process has started its backends.
  assert xla_cpu.backends_started()
  monkeypatch.delattr(xla_bridge, "backends_are_initialized")  # As a JAX that dropped or moved it.
  assert xla_cpu.backends_started() is False
