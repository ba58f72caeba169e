"""FLOPs come from the compiled per-device program; peak FLOP/s are known for named devices, never for CPU."""

import logging
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp.report import flops

M, K, N = 64, 128, 256
MATMUL_FLOPS = 2 * M * K * N


def _operands():
  return jnp.ones((M, K)), jnp.ones((K, N))


def test_matmul_flops_on_one_device():
  assert flops.step_flops(jax.jit(lambda a, b: a @ b), *_operands()) == MATMUL_FLOPS


def test_shard_map_and_pmap_count_per_device():
  a, b = _operands()
  n = jax.device_count()
  mesh = Mesh(np.array(jax.devices()), ("data",))
  sharded = jax.jit(jax.shard_map(lambda a, b: a @ b, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data")))
  assert flops.step_flops(sharded, jax.device_put(a, NamedSharding(mesh, P("data"))), b) == MATMUL_FLOPS / n
  mapped = jax.pmap(lambda a, b: a @ b, in_axes=(0, None))
  assert flops.step_flops(mapped, a.reshape(n, M // n, K), b) == MATMUL_FLOPS / n


def test_the_lowered_count_is_per_device_and_compiles_nothing(caplog):
  """flops.lowered_flops (the accumulation's loop-free step): the same counts as the compiled ones, no compile."""
  a, b = _operands()
  n = jax.device_count()
  mesh = Mesh(np.array(jax.devices()), ("data",))
  sharded = jax.jit(jax.shard_map(lambda a, b: a @ b, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data")))
  mapped = jax.pmap(lambda a, b: a @ b, in_axes=(0, None))
  a_sharded, a_mapped = jax.device_put(a, NamedSharding(mesh, P("data"))), a.reshape(n, M // n, K)
  with caplog.at_level(logging.WARNING), jax.log_compiles(True):
    # Before optimization XLA's count of a dot is 2MKN less a few (the first product of each sum is no add).
    assert flops.lowered_flops(jax.jit(lambda a, b: a @ b), a, b) == pytest.approx(MATMUL_FLOPS, rel=1e-4)
    assert flops.lowered_flops(sharded, a_sharded, b) == pytest.approx(MATMUL_FLOPS / n, rel=1e-4)
    assert flops.lowered_flops(mapped, a_mapped, b) == pytest.approx(MATMUL_FLOPS / n, rel=1e-4)
  assert not [r for r in caplog.records if "Finished XLA compilation" in r.getMessage()], caplog.text


def test_counting_does_not_compile_twice(caplog):
  a, b = _operands()
  f = jax.jit(lambda a: jnp.tanh(a) @ b)
  assert flops.step_flops(f, a) >= MATMUL_FLOPS
  with caplog.at_level(logging.WARNING), jax.log_compiles(True):
    f(a)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()], caplog.text


@pytest.mark.parametrize("platform, kind, peak", [
    ("gpu", "NVIDIA H100 80GB HBM3", 989e12),
    ("gpu", "NVIDIA H100 PCIe", 756e12),
    ("gpu", "NVIDIA H200", 989e12),
    ("gpu", "NVIDIA A100-SXM4-40GB", 312e12),
    ("gpu", "NVIDIA GeForce GTX 1080", None),
    ("tpu", "TPU v4", 275e12),
    ("tpu", "TPU v5 lite", 197e12),
    ("tpu", "TPU v5", 459e12),
    ("tpu", "TPU v9 imaginary", None),
])
def test_peak_flops_of_device_kinds(platform, kind, peak):
  assert flops.peak_flops(types.SimpleNamespace(platform=platform, device_kind=kind)) == peak


def test_no_peak_and_no_mfu_on_cpu():
  peak = flops.peak_flops(jax.devices()[0])
  assert peak is None
  assert flops.mfu(1e9, 0.1, peak) is None


def test_mfu_is_achieved_over_peak():
  assert flops.mfu(2e12, 0.5, 8e12) == pytest.approx(0.5)
  assert flops.mfu(None, 0.5, 8e12) is None
