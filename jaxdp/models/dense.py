"""`dense_dot`: nnx.Linear's dot_general, with a weight gradient that XLA:CPU runs in YNNPACK, not Eigen.

A dense layer's kernel gradient is dW = X^T dY, a dot contracting dimension 0 of the row-major inputs
[rows, in]. XLA:CPU's YNNPACK fusion takes no such dot (lhs_contracting_dims={0}), so every weight gradient
falls to Eigen, at about half YNNPACK's speed on one core. `dense_dot`'s backward first copies X^T into its own
[in, rows] array, opaque to XLA (else it folds the transpose back into the dot: `_transposed`), making
dW an NN dot that YNNPACK takes; the input's gradient dY W^T is NT, which it takes already
(experiments/dense_parts.md). Use it as `nnx.Linear(..., dot_general=dense_dot)`: no parameter changes.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

# What nnx.Linear asks for: inputs [..., in] contracting their last dimension with the kernel's first, no batch.
DimensionNumbers = tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]


def dense_dot(lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers, precision: Any = None,
              preferred_element_type: Any = None, out_sharding: Any = None) -> jax.Array:
  """lax.dot_general, with a CPU-friendly backward for a dense layer's product (inputs [..., in] @ kernel [in, out])."""
  if not (_is_dense(lhs, rhs, dimension_numbers) and out_sharding is None and _on_cpu()):
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type, out_sharding=out_sharding)
  lhs, rhs = _same_vma(lhs, rhs)
  return _dense(lhs, rhs, precision, preferred_element_type)


def _same_vma(x: jax.Array, kernel: jax.Array) -> tuple[jax.Array, jax.Array]:
  """x and kernel, each marked varying over the shard_map axes the other varies over (none outside one)."""
  # lax.dot_general marks an invariant operand varying itself, and the transpose of that mark is the psum that
  # gives an invariant kernel (replicated parameters under a checked shard_map) its summed gradient. A custom
  # VJP's backward must return each cotangent with its primal's type, so the mark is made here, outside it,
  # and autodiff adds the same psum.
  x_vma, kernel_vma = jax.typeof(x).manual_axis_type.varying, jax.typeof(kernel).manual_axis_type.varying
  if kernel_vma - x_vma:
    x = lax.pcast(x, tuple(sorted(kernel_vma - x_vma)), to="varying")
  if x_vma - kernel_vma:
    kernel = lax.pcast(kernel, tuple(sorted(x_vma - kernel_vma)), to="varying")
  return x, kernel


def _is_dense(lhs: jax.Array, rhs: jax.Array, dimension_numbers: DimensionNumbers) -> bool:
  """Whether the product is nnx.Linear's: lhs [..., in] contracting its last dimension with a 2-D rhs's first."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  ndim = getattr(lhs, "ndim", 0)
  return (ndim >= 1 and getattr(rhs, "ndim", 0) == 2 and tuple(lhs_contract) == (ndim - 1,)
          and tuple(rhs_contract) == (0,) and not lhs_batch and not rhs_batch)


def _on_cpu() -> bool:
  """Whether programs traced now compile for XLA:CPU (the default backend), decided at trace time."""
  # Only XLA:CPU needs the copy: GPU and TPU dot libraries take the TN layout as it is, and there the copy
  # would only keep XLA from fusing the transpose (and the custom VJP would needlessly rule out forward-mode
  # differentiation). The default backend is where jit places an uncommitted computation, i.e. jaxdp's steps.
  return jax.default_backend() == "cpu"


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dense(x: jax.Array, kernel: jax.Array, precision: Any, preferred_element_type: Any) -> jax.Array:
  """x [..., in] @ kernel [in, out], as lax.dot_general computes it."""
  return lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision,
                         preferred_element_type=preferred_element_type)


def _dense_fwd(x: jax.Array, kernel: jax.Array, precision: Any,
               preferred_element_type: Any) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  return _dense(x, kernel, precision, preferred_element_type), (x, kernel)


def _dense_bwd(precision: Any, preferred_element_type: Any, residuals: tuple[jax.Array, jax.Array],
               dy: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(dx, dkernel) as lax.dot_general's transpose rules give them, with dkernel computed as an NN dot."""
  x, kernel = residuals
  kwargs = {"precision": precision, "preferred_element_type": preferred_element_type}
  # dx = dy [..., out] @ kernel^T: NT, the same dot as lax's own transpose rule writes.
  dx = lax.dot_general(dy, kernel, (((dy.ndim - 1,), (1,)), ((), ())), **kwargs)
  # dkernel = x^T [in, rows] @ dy [rows, out]; _transposed keeps the transpose a copy of its own.
  rows_x = x.reshape(-1, x.shape[-1])
  rows_dy = dy.reshape(-1, dy.shape[-1])
  x_t = _transposed(rows_x)
  dkernel = lax.dot_general(x_t, rows_dy, (((1,), (0,)), ((), ())), **kwargs)
  # As lax's rules: each cotangent in its primal's dtype (they differ when preferred_element_type is wider).
  return dx.astype(x.dtype), dkernel.astype(kernel.dtype)


def _transposed(x: jax.Array) -> jax.Array:
  """x.T [in, rows] as an array of its own, which XLA neither folds back into the dot nor fuses with x's producer."""
  # An optimization barrier around x.T keeps the transpose from folding into the dot, but XLA:CPU removes
  # barriers before it fuses and then fuses x's producer (a bias add and ReLU) into the transpose: a loop that
  # reads x with a stride of `in` elements, about 4 ms for [512, 1024] on one core against under 1 ms for
  # the plain copy of a materialized x; with the copy plain, the MLP's fwd+bwd takes 0.88 of the time
  # (experiments/dense_parts.md, "The transpose's fusion"). A conditional's operand is materialized and its
  # branches compile apart, so a cond whose branches are the same transpose is both: opaque to the dot and a
  # plain copy. Its predicate reads x, so that XLA cannot fold the cond away; either branch gives x.T.
  if not x.size:
    return x.T
  return lax.cond(x[0, 0] == x[0, 0], jnp.transpose, jnp.transpose, x)


_dense.defvjp(_dense_fwd, _dense_bwd)
