"""The built-in models: a bad choice is one ConfigError naming it; ResNet's stages see the sizes its recipe says;
the CNN and the MLP compute their reference formulations; the built-in MLP is a user's plain nnx.Linear MLP."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdp.config import ConfigError
from jaxdp.models.cnn import CNN
from jaxdp.models.gpt import GPT
from jaxdp.models.mlp import MLP
from jaxdp.models.resnet import BasicBlock, Bottleneck, ResNet


@pytest.mark.parametrize("make, words", [
    (lambda: GPT((16,), 256, num_heads=3, embed_dim=64, rngs=nnx.Rngs(0)),
     r"embed_dim \(64\) must be divisible by num_heads \(3\)"),
    (lambda: GPT((16,), 256, positions="sinusoid", rngs=nnx.Rngs(0)), "unknown model positions 'sinusoid'"),
    (lambda: ResNet((32, 32, 3), 10, stem="tiny", rngs=nnx.Rngs(0)), "unknown model stem 'tiny'"),
    (lambda: ResNet((32, 32, 3), 10, block="wide", rngs=nnx.Rngs(0)), "unknown model block 'wide'"),
])
def test_a_bad_choice_of_a_built_in_model_is_a_config_error_naming_it(make, words):
  with pytest.raises(ConfigError, match=words):
    make()


def _block_inputs(model: ResNet, image_size: int, monkeypatch) -> list[tuple[int, ...]]:
  """The shape of what each block of `model` is called on, for one image."""
  seen = []
  for cls in (BasicBlock, Bottleneck):
    call = cls.__call__
    monkeypatch.setattr(cls, "__call__", lambda self, x, call=call: seen.append(x.shape[1:]) or call(self, x))
  nnx.eval_shape(lambda m, x: m(x), model, jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32))
  return seen


def test_resnet_stages_halve_the_size_from_the_second_on_after_the_stem(monkeypatch):
  # Abstract models, traced: shapes are all this reads (made eagerly, each kernel's init compiles: tens of seconds).
  cifar = nnx.eval_shape(lambda: ResNet((32, 32, 3), 10, width=8, bn_axis_name=None, rngs=nnx.Rngs(0)))
  assert _block_inputs(cifar, 32, monkeypatch) == [(32, 32, 8), (32, 32, 8), (32, 32, 8), (16, 16, 16),
                                                    (16, 16, 16), (8, 8, 32), (8, 8, 32), (4, 4, 64)]
  # The ImageNet stem: a stride-2 convolution, then a stride-2 max-pool: a quarter of the side.
  imagenet = nnx.eval_shape(lambda: ResNet((64, 64, 3), 10, (1, 1), width=8, stem="imagenet", block="bottleneck",
                                           bn_axis_name=None, rngs=nnx.Rngs(0)))
  assert _block_inputs(imagenet, 64, monkeypatch)[-2:] == [(16, 16, 8), (16, 16, 32)]


def test_the_cnn_is_convolutions_an_average_pool_and_two_dense_layers():
  model = CNN((8, 8, 1), 10, rngs=nnx.Rngs(0))
  x = jax.random.uniform(jax.random.PRNGKey(1), (2, 8, 8, 1))
  h = x
  for conv in model.convs:
    h = nnx.relu(conv(h))
  pooled = h.reshape(2, 4, 2, 4, 2, -1).mean(axis=(2, 4))  # 2x2 windows averaged.
  expected = model.head(nnx.relu(model.dense(pooled.reshape(2, -1))))
  np.testing.assert_allclose(model(x), expected, rtol=1e-5, atol=1e-6)


def test_the_mlp_is_relu_hidden_layers_then_logits():
  model = MLP((4, 4, 2), 10, hidden=(16, 8), rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 4, 4, 2))
  h = x.reshape(3, 32)
  for layer in model.hidden:
    h = jnp.maximum(h @ layer.kernel[...] + layer.bias[...], 0)
  np.testing.assert_allclose(model(x), h @ model.head.kernel[...] + model.head.bias[...], rtol=1e-5, atol=1e-6)


class UsersMLP(nnx.Module):
  """The MLP as a user writes it: plain nnx.Linear layers."""

  def __init__(self, widths: list[int], *, rngs: nnx.Rngs):
    self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-2], widths[1:-1])])
    self.head = nnx.Linear(widths[-2], widths[-1], rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape(x.shape[0], -1)
    for layer in self.hidden:
      x = nnx.relu(layer(x))
    return self.head(x)


def _grad_program(model: nnx.Module, x: jax.Array) -> str:
  """The jaxpr of the gradient of a loss of `model` w.r.t. its parameters."""
  graph, params = nnx.split(model)
  loss = lambda p: jnp.sum(nnx.merge(graph, p)(x) ** 2)  # noqa: E731
  return str(jax.make_jaxpr(jax.grad(loss))(params))


def test_the_built_in_mlp_trains_the_program_a_user_s_plain_mlp_trains():
  """No platform trick only built-in models get: their benchmarks stand for a user's model."""
  x = jnp.ones((4, 4, 4, 2))
  builtin = _grad_program(MLP((4, 4, 2), 10, hidden=(16, 8), rngs=nnx.Rngs(0)), x)
  assert builtin == _grad_program(UsersMLP([32, 16, 8, 10], rngs=nnx.Rngs(0)), x)
