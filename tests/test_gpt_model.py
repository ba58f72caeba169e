"""jaxdp.models.gpt computes the function of its reference formulation (library attention, split + concat rotary)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdp.models import gpt


def reference_rotary(x: jax.Array, base: float = 10000.0) -> jax.Array:
  """Rotary as first written: the halves split, rotated, concatenated."""
  t, dim = x.shape[1], x.shape[-1]
  freqs = base ** (-jnp.arange(0, dim // 2, dtype=jnp.float32) * 2 / dim)
  angles = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]
  cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def reference_forward(model: gpt.GPT, tokens: jax.Array) -> jax.Array:
  """The GPT's logits through jax.nn.dot_product_attention and reference_rotary, on the model's own parameters."""
  x = model.embed(tokens.astype(jnp.int32))
  if model.pos is not None:
    x = x + model.pos[:tokens.shape[1]]
  for block in model.blocks:
    attn, (b, t, d) = block.attn, x.shape
    q, k, v = jnp.split(attn.qkv(block.ln1(x)).reshape(b, t, 3 * attn.num_heads, d // attn.num_heads), 3, axis=2)
    if attn.use_rotary:
      q, k = reference_rotary(q), reference_rotary(k)
    x = x + attn.out(jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, d))
    x = x + block.proj(nnx.gelu(block.fc(block.ln2(x))))
  return model.head(model.ln_f(x))


@nnx.jit(static_argnums=0)  # Made in one program: eagerly, each shape's random init compiles alone.
def _model(positions: str) -> gpt.GPT:
  # Weights larger than the init's 0.02 so that attention is far from uniform and rotary matters.
  model = gpt.GPT((16,), 256, num_layers=2, num_heads=4, embed_dim=64, positions=positions, rngs=nnx.Rngs(3))
  graph, params = nnx.split(model)
  params = jax.tree.map(lambda p, k: p + 0.3 * jax.random.normal(k, p.shape),
                        params, jax.tree.unflatten(jax.tree.structure(params),
                                                   list(jax.random.split(jax.random.PRNGKey(4),
                                                                         len(jax.tree.leaves(params))))))
  return nnx.merge(graph, params)


def test_rotary_matches_the_split_concat_formulation():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 16, 8, 32))
  np.testing.assert_allclose(gpt.rotary(x), reference_rotary(x), rtol=0, atol=1e-6)
  assert gpt.rotary(x.astype(jnp.bfloat16)).dtype == jnp.bfloat16


def test_causal_attention_matches_the_library():
  q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (2, 16, 4, 32)) * 2 for i in range(3))
  expected = jax.nn.dot_product_attention(q, k, v, is_causal=True)
  np.testing.assert_allclose(gpt.causal_attention(q, k, v), expected, rtol=0, atol=2e-6)
  # Causal: position t's output does not depend on later positions.
  changed = gpt.causal_attention(q, k.at[:, 8:].set(0), v.at[:, 8:].set(0))
  np.testing.assert_array_equal(changed[:, :8], gpt.causal_attention(q, k, v)[:, :8])


@pytest.mark.parametrize("positions", ["rotary", "learned"])
def test_forward_and_gradient_match_the_reference(positions):
  model = _model(positions)
  tokens = jax.random.randint(jax.random.PRNGKey(5), (3, 16), 0, 256).astype(jnp.float32)
  labels = jax.random.randint(jax.random.PRNGKey(6), (3, 16), 0, 256)
  graph, params = nnx.split(model)

  def loss(params: nnx.State, forward) -> jax.Array:
    logits = forward(nnx.merge(graph, params), tokens)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1).mean()

  # Each side compiled whole: op by op, the two forwards and backwards compile every op alone.
  forward = jax.jit(lambda params, f: f(nnx.merge(graph, params), tokens), static_argnums=1)
  logits, expected = forward(params, gpt.GPT.__call__), forward(params, reference_forward)
  assert float(jnp.abs(expected).max()) > 1.0  # Far from zero: the tolerance below is a relative one.
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5 * float(jnp.abs(expected).max()))
  grad = jax.jit(jax.grad(loss), static_argnums=1)
  got, want = grad(params, gpt.GPT.__call__), grad(params, reference_forward)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    scale = float(jnp.abs(w).max())
    assert scale > 0
    np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * scale)


def test_parameter_tree_is_unchanged():
  """The names and shapes users' checkpoints and benchmarks/four_way_torch.py's loader rely on."""
  params = nnx.state(nnx.eval_shape(lambda: gpt.GPT((64,), 256, positions="rotary", rngs=nnx.Rngs(0))), nnx.Param)
  shapes = {"/".join(str(getattr(k, "key", k)) for k in path[:-1]): tuple(v.shape)  # path[-1]: the leaf's .value.
            for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  assert len(shapes) == 1 + 4 * 12 + 4  # embed; per block 2 LayerNorms and 4 Linears (2 each); ln_f, head.
  assert shapes["embed/embedding"] == (256, 128)
  assert shapes["blocks/0/attn/qkv/kernel"] == (128, 384)
  assert shapes["blocks/3/attn/out/bias"] == (128,)
  assert shapes["blocks/1/fc/kernel"] == (128, 512)
  assert shapes["ln_f/scale"] == (128,) and shapes["head/kernel"] == (128, 256)


def test_the_init_is_gpt2s_with_residual_projections_scaled_by_depth():
  model = gpt.GPT((64,), 256, num_layers=8, embed_dim=256, rngs=nnx.Rngs(0))
  block = model.blocks[5]
  for kernel, std in [(block.attn.qkv.kernel, 0.02), (block.fc.kernel, 0.02), (model.head.kernel, 0.02),
                      (block.attn.out.kernel, 0.02 / 4), (block.proj.kernel, 0.02 / 4)]:  # 0.02 / sqrt(2 x 8).
    assert float(jnp.std(kernel[...])) == pytest.approx(std, rel=0.05)
  assert float(jnp.std(model.embed.embedding[...])) == pytest.approx(0.02, rel=0.05)
