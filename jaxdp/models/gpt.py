"""A small decoder-only transformer (NNX): token ids [B, T] -> next-token logits [B, T, vocab], pre-LayerNorm."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdp.config import ConfigError

POSITIONS = ("learned", "rotary")


def rotary(x: jax.Array, base: float = 10000.0) -> jax.Array:
  """Rotary position embedding of x [B, T, heads, head_dim] (head_dim even), position = index in T."""
  t, dim = x.shape[1], x.shape[-1]
  freqs = base ** (-jnp.arange(0, dim // 2, dtype=jnp.float32) * 2 / dim)
  angles = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]   # [T, dim/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  # Halves [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin] as x * [cos, cos] + flip(x) * [-sin, sin]: the same
  # numbers, and a flip fuses where a split + concatenate did not (docs/design-notes.md#gpt-on-xlacpu).
  c = jnp.stack([cos, cos], axis=1)[None, :, None]   # [1, T, 1, 2, dim/2]: broadcast over batch and heads.
  s = jnp.stack([-sin, sin], axis=1)[None, :, None]
  halves = x.astype(jnp.float32).reshape(*x.shape[:-1], 2, dim // 2)
  return (halves * c + jnp.flip(halves, axis=-2) * s).reshape(x.shape).astype(x.dtype)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """jax.nn.dot_product_attention(q, k, v, is_causal=True) of [B, T, heads, head_dim], its XLA path written out."""
  # The library's einsums, scale, mask value and softmax, without its grouped-query vmap and per-call mask
  # (docs/design-notes.md#gpt-on-xlacpu); on GPU and TPU its default is this same XLA path.
  t, s, dim = q.shape[1], k.shape[1], q.shape[-1]
  dtype = jnp.promote_types(q.dtype, jnp.float32)
  logits = jnp.einsum("BTNH,BSNH->BNTS", q, k, preferred_element_type=dtype) * jnp.array(1.0 / np.sqrt(dim), dtype)
  logits = jnp.where(jnp.tril(jnp.ones((t, s), bool)), logits, jnp.array(-0.7 * jnp.finfo(dtype).max, dtype))
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(v.dtype)
  return jnp.einsum("BNTS,BSNH->BTNH", probs, v)


class CausalSelfAttention(nnx.Module):
  """Multi-head self-attention in which position t attends to positions <= t only."""

  def __init__(self, dim: int, num_heads: int, use_rotary: bool, out_init: nnx.Initializer, *, rngs: nnx.Rngs):
    if dim % num_heads:
      raise ConfigError(f"model embed_dim ({dim}) must be divisible by num_heads ({num_heads})")
    self.num_heads, self.use_rotary = num_heads, use_rotary
    self.qkv = nnx.Linear(dim, 3 * dim, kernel_init=nnx.initializers.normal(0.02), rngs=rngs)
    self.out = nnx.Linear(dim, dim, kernel_init=out_init, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    b, t, d = x.shape
    h = self.num_heads
    qkv = self.qkv(x).reshape(b, t, 3 * h, d // h)
    qk, v = qkv[:, :, :2 * h], qkv[:, :, 2 * h:]
    if self.use_rotary:  # q's and k's heads in one call: rotary acts on each head alike.
      qk = rotary(qk)
    y = causal_attention(qk[:, :, :h], qk[:, :, h:], v)
    return self.out(y.reshape(b, t, d))


class Block(nnx.Module):
  """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

  def __init__(self, dim: int, num_heads: int, mlp_ratio: int, use_rotary: bool, num_layers: int,
               *, rngs: nnx.Rngs):
    out_init = nnx.initializers.normal(0.02 / (2 * num_layers) ** 0.5)  # GPT-2: scaled residual projections.
    self.ln1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attn = CausalSelfAttention(dim, num_heads, use_rotary, out_init, rngs=rngs)
    self.ln2 = nnx.LayerNorm(dim, rngs=rngs)
    self.fc = nnx.Linear(dim, mlp_ratio * dim, kernel_init=nnx.initializers.normal(0.02), rngs=rngs)
    self.proj = nnx.Linear(mlp_ratio * dim, dim, kernel_init=out_init, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x + self.attn(self.ln1(x))
    return x + self.proj(nnx.gelu(self.fc(self.ln2(x))))


class GPT(nnx.Module):
  """Decoder-only transformer over `num_classes` tokens (the vocabulary) and contexts of input_shape[0]."""

  def __init__(self, input_shape: Sequence[int], num_classes: int, num_layers: int = 4, num_heads: int = 4,
               embed_dim: int = 128, mlp_ratio: int = 4, positions: str = "learned", *, rngs: nnx.Rngs):
    if positions not in POSITIONS:
      raise ConfigError(f"unknown model positions {positions!r} (choose from {', '.join(POSITIONS)})")
    self.seq_len = input_shape[0]
    self.embed = nnx.Embed(num_classes, embed_dim, embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
    learned = positions == "learned"
    self.pos = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (self.seq_len, embed_dim))) if learned else None
    self.blocks = nnx.List([Block(embed_dim, num_heads, mlp_ratio, positions == "rotary", num_layers, rngs=rngs)
                            for _ in range(num_layers)])
    self.ln_f = nnx.LayerNorm(embed_dim, rngs=rngs)
    # Untied from the embedding: on small texts it leaves the unigram plateau far sooner (about 100 vs 250 steps).
    self.head = nnx.Linear(embed_dim, num_classes, kernel_init=nnx.initializers.normal(0.02), rngs=rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    # The input pipeline hands over float32; ids < 2**24 are exact in float32.
    x = self.embed(tokens.astype(jnp.int32))
    if self.pos is not None:
      x = x + self.pos[:tokens.shape[1]]
    for block in self.blocks:
      x = block(x)
    return self.head(self.ln_f(x))
