"""jaxdp.models.dense_dot: lax.dot_general's values and gradients, with every XLA:CPU dot in YNNPACK's layouts."""

import functools
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxdp import models, train
from jaxdp.models import dense_dot, mlp
from jaxdp.report import metrics

# A different summation order over the rows (the kernel gradient's contraction) moves float32 by a few ulps of
# the largest term; bfloat16 results are rounded to 8 bits after the float32 sum, so an order change can move
# one by one bfloat16 ulp (2**-8 relative), never more.
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 2**-7}
# A dot that contracts its lhs's dimension 0 (X^T dY as written): XLA:CPU's YNNPACK takes none of them.
TN_DOT = re.compile(r"\bdot\(.*lhs_contracting_dims=\{0\}")


def _loss(dot, x, kernel, **kwargs):
  """A scalar of a Linear-shaped product (nonlinear, so that every cotangent differs); `kwargs` go to `dot`."""
  y = dot(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), **kwargs)
  return jnp.sum(jnp.tanh(y.astype(jnp.float32)))


def _inputs(shape, dtype, out=24):
  x = jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(dtype)
  kernel = (jax.random.normal(jax.random.key(1), (shape[-1], out), jnp.float32) / 4).astype(dtype)
  return x, kernel


def _close(a, b, dtype):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  np.testing.assert_allclose(a, b, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * np.abs(b).max())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(64, 32), (4, 16, 32)], ids=["2d", "3d"])
def test_value_and_gradients_match_lax(shape, dtype):
  x, kernel = _inputs(shape, dtype)
  ours = jax.jit(jax.value_and_grad(functools.partial(_loss, dense_dot), argnums=(0, 1)))(x, kernel)
  theirs = jax.jit(jax.value_and_grad(functools.partial(_loss, lax.dot_general), argnums=(0, 1)))(x, kernel)
  assert [g.dtype for g in ours[1]] == [dtype, dtype]
  assert ours[0] == theirs[0]  # The forward is lax.dot_general itself.
  for a, b in zip(ours[1], theirs[1]):
    _close(a, b, dtype)


def test_other_products_go_to_lax_and_keep_forward_mode():
  """A batched product is not a Linear's: lax.dot_general's, which forward-mode autodiff can differentiate."""
  a, b = _inputs((2, 8, 4), jnp.float32)[0], _inputs((2, 4, 3), jnp.float32)[0]
  batched = (((2,), (1,)), ((0,), (0,)))
  ours = jax.jvp(lambda a: dense_dot(a, b, batched), (a,), (a,))
  theirs = jax.jvp(lambda a: lax.dot_general(a, b, batched), (a,), (a,))
  jax.tree.map(np.testing.assert_array_equal, ours, theirs)


def test_a_product_contracting_the_kernels_last_dimension_is_lax_s():
  """x @ W^T written as one dot_general is no Linear's product: lax.dot_general's value and forward mode."""
  x, kernel = _inputs((8, 4), jnp.float32, out=3)
  nt = (((1,), (1,)), ((), ()))
  ours = jax.jvp(lambda x: dense_dot(x, kernel.T, nt), (x,), (x,))
  theirs = jax.jvp(lambda x: lax.dot_general(x, kernel.T, nt), (x,), (x,))
  jax.tree.map(np.testing.assert_array_equal, ours, theirs)


def test_a_wider_result_type_gives_cotangents_of_the_inputs_dtype():
  x, kernel = _inputs((64, 32), jnp.bfloat16)
  wide = {"preferred_element_type": jnp.float32}
  ours = jax.jit(jax.grad(functools.partial(_loss, dense_dot, **wide), argnums=(0, 1)))(x, kernel)
  theirs = jax.jit(jax.grad(functools.partial(_loss, lax.dot_general, **wide), argnums=(0, 1)))(x, kernel)
  assert [g.dtype for g in ours] == [g.dtype for g in theirs] == [jnp.bfloat16, jnp.bfloat16]
  for a, b in zip(ours, theirs):
    _close(a, b, jnp.bfloat16)


def test_no_rows_give_lax_s_zero_gradients():
  x, kernel = _inputs((0, 32), jnp.float32)
  ours = jax.jit(jax.grad(functools.partial(_loss, dense_dot), argnums=(0, 1)))(x, kernel)
  assert ours[0].shape == (0, 32)
  np.testing.assert_array_equal(ours[1], np.zeros_like(kernel))


def _dots(fn, *args):
  return [line for line in jax.jit(fn).lower(*args).compile().as_text().splitlines() if TN_DOT.search(line)]


@pytest.mark.parametrize("shape", [(512, 256), (4, 128, 256)], ids=["2d", "3d"])
def test_no_cpu_dot_contracts_the_rows(shape):
  """The optimised HLO of a Linear's value_and_grad has no TN dot with dense_dot, and has one without."""
  def step(dot):
    layer = nnx.Linear(shape[-1], 128, dot_general=dot, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(layer)
    x = jnp.ones(shape)
    loss = lambda p, x: jnp.sum(jnp.tanh(nnx.merge(graphdef, p)(x)))
    return functools.partial(jax.value_and_grad(loss), params), x

  assert jax.default_backend() == "cpu"
  assert not _dots(*step(dense_dot))
  assert len(_dots(*step(lax.dot_general))) == 1


def test_no_cpu_dot_contracts_the_rows_in_the_mlp():
  model = models.get_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (256, 256)}), (784,), 10)
  params, state = model.init(jax.random.key(0))
  x = jnp.ones((512, 784))
  loss = lambda p: jnp.sum(model.apply(p, state, x, train=True)[0])
  assert not _dots(jax.grad(loss), params)


def test_no_cpu_dot_contracts_the_rows_in_the_gpt():
  """Every Linear of the GPT (attention's, the MLP's, the head) gives NN weight gradients too."""
  config = ml_collections.ConfigDict({"name": "gpt", "num_layers": 1, "num_heads": 2, "embed_dim": 32})
  model = models.get_model(config, (16,), 40)
  params, state = model.init(jax.random.key(0))
  tokens = jnp.ones((4, 16))
  loss = lambda p: jnp.sum(jnp.tanh(model.apply(p, state, tokens, train=True)[0]))
  assert not _dots(jax.grad(loss), params)


def _fused_transposes(hlo: str) -> list[str]:
  """The fused computations of an optimised HLO that transpose a value they compute themselves."""
  bodies = re.finditer(r"^%(fused_computation\S*) .*?^}", hlo, re.M | re.S)
  return [body[1] for body in bodies
          if " transpose(" in body[0] and re.search(r" (add|maximum|select|multiply)\(", body[0])]


def test_the_mlp_transposes_materialized_activations():
  """No weight gradient's X^T is a loop that recomputes X (bias add, ReLU) as it transposes: 4 ms, not under 1."""
  model = models.get_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (1024, 1024)}), (784,), 10)
  params, state = model.init(jax.random.key(0))
  x = jnp.ones((512, 784))
  loss = lambda p: jnp.sum(model.apply(p, state, x, train=True)[0])
  assert not _fused_transposes(jax.jit(jax.grad(loss)).lower(params).compile().as_text())


def _grad(dot, x, kernel):
  return jax.grad(functools.partial(_loss, dot), argnums=1)(x, kernel)


@pytest.mark.parametrize("checked, varying", [(True, True), (True, False), (False, True)],
                         ids=["checked-varying", "checked-invariant", "unchecked"])
def test_gradients_under_shard_map(checked, varying):
  """Replicated kernels, marked varying or not (then autodiff sums their gradient over devices, as lax's)."""
  mesh = jax.make_mesh((8,), ("d",))
  x, kernel = _inputs((64, 32), jnp.float32)
  x, kernel = jax.device_put(x, NamedSharding(mesh, P("d"))), jax.device_put(kernel, NamedSharding(mesh, P()))

  def per_device(dot, x, kernel):
    if varying and checked:
      kernel = lax.pcast(kernel, "d", to="varying")
    g = _grad(dot, x, kernel)
    return g if checked and not varying else lax.psum(g, "d")

  mapped = lambda dot: jax.jit(jax.shard_map(functools.partial(per_device, dot), mesh=mesh, in_specs=(P("d"), P()),
                                             out_specs=P(), check_vma=checked))(x, kernel)
  _close(mapped(dense_dot), mapped(lax.dot_general), jnp.float32)


@pytest.mark.parametrize("transform", ["pmap", "vmap", "checkpoint", "scan"])
def test_gradients_under_transforms(transform):
  x, kernel = _inputs((8, 4, 32), jnp.float32)
  if transform == "pmap":
    fn = lambda dot: jax.pmap(functools.partial(_grad, dot), in_axes=(0, None))(x, kernel)
  elif transform == "vmap":
    fn = lambda dot: jax.jit(jax.vmap(functools.partial(_grad, dot), in_axes=(0, None)))(x, kernel)
  elif transform == "checkpoint":
    fn = lambda dot: jax.jit(jax.grad(jax.checkpoint(functools.partial(_loss, dot)), argnums=1))(x, kernel)
  else:  # Gradient accumulation: a loop over micro-batches.
    def fn(dot):
      total = lambda k: lax.scan(lambda c, xi: (c + _loss(dot, xi, k), None), 0.0, x)[0]
      return jax.jit(jax.grad(total))(kernel)
  _close(fn(dense_dot), fn(lax.dot_general), jnp.float32)


@pytest.mark.parametrize("backend, overrides", [
    ("mesh", {}), ("pmap", {}), ("mesh", {"parallel.invariant": True}),
    ("mesh", {"parallel.shard_optimizer_state": True, "grad_accum_steps": 2})],
    ids=["mesh", "pmap", "invariant", "zero1-accum"])
def test_train_steps_match_lax(config, tmp_path, monkeypatch, backend, overrides):
  """jaxdp's MLP trains on 8 devices as with lax.dot_general, to float32 rounding."""
  config.parallel.backend, config.num_train_steps, config.batch_size = backend, 2, 64
  for key, value in overrides.items():
    config.update_from_flattened_dict({key: value})

  def run(name):
    result = train.train_and_evaluate(config, str(tmp_path / name))
    losses = [r["train/loss"] for r in metrics.read(str(tmp_path / name)) if "train/loss" in r]
    return losses, result.params

  ours = run("dense_dot")
  monkeypatch.setattr(mlp, "dense_dot", lax.dot_general)
  theirs = run("lax")
  assert ours[0]  # A loss was logged.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), ours, theirs)
