"""The train step read without running it (`inspect`, `topology`): abstract inputs, collectives, memory, options."""

import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import build, data, objects, parallel

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")
Shape = tuple[str, tuple[int, ...]]  # (numpy dtype name, dims)


def batch_shapes(ds: data.Dataset, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
  """A batch of `rows` examples of every feature of `ds` as the pipeline hands it to the step (shapes, dtypes)."""
  # Text and other non-numeric features never reach a device: a step cannot take them.
  return {name: jax.ShapeDtypeStruct((rows, *x.shape), x.dtype) for name, x in ds.element_spec().items()
          if np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.bool_)}


def fake_batch(shapes: dict[str, jax.ShapeDtypeStruct], seed: int = 0) -> dict[str, np.ndarray]:
  """Random host arrays of `shapes`, valid for any task: floats standard normal, integers and bools 0 or 1."""
  # 0 and 1 are a class, token id or mask value of every feature; a wider range could index past a small vocabulary.
  rng = np.random.default_rng(seed)
  return {name: (rng.standard_normal(x.shape) if np.issubdtype(x.dtype, np.floating)
                 else rng.integers(0, 2, x.shape)).astype(x.dtype) for name, x in shapes.items()}


def abstract_inputs(parts: build.Parts, abstract: Any) -> tuple[Any, Any]:
  """(state, what a train step takes) shapes laid out as the backend lays them out: a block of one step."""
  backend, layout = parts.backend, parts.layout
  spec = {k: jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for k, x in batch_shapes(parts.ds, 1).items()}
  item = backend.abstract_item(spec, layout.process_batch, 1)
  if isinstance(backend, parallel.PmapBackend):  # One [local_devices] axis in front of everything.
    n = len(backend.local_devices)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((n, *x.shape), x.dtype), abstract), item
  return backend.abstract_global(abstract), item


def run_options(parts: build.Parts) -> dict[str, Any]:
  """What was compiled: model, backend, devices, batch layout and the options that change the step."""
  config, device, tx = parts.config, parts.backend.devices[0], parts.config.optimizer
  return {"model": config.model.name, "backend": config.parallel.backend, "devices": parts.backend.num_devices,
          "platform": parts.backend.platform, "device_kind": device.device_kind,
          "optimizer": tx if isinstance(tx, str) else objects.object_name(tx),
          "global_batch": parts.layout.global_batch, "per_device_batch": parts.layout.per_device_batch,
          "grad_accum_steps": config.grad_accum_steps, "dtype": config.dtype,
          "allreduce_dtype": config.parallel.allreduce_dtype,
          "shard_optimizer_state": bool(config.parallel.shard_optimizer_state),
          "shard_params": bool(config.parallel.shard_params), "layout": parts.strategy.holds}


def memory(compiled: Any) -> dict[str, int] | None:
  """Per-device bytes from XLA's memory analysis; None where the backend has none."""
  try:
    stats = compiled.memory_analysis()  # None where the backend has none.
  except RuntimeError:
    return None
  if stats is None:
    return None
  out = {f"{name}_bytes": int(getattr(stats, f"{name}_size_in_bytes"))
         for name in ("argument", "output", "temp", "alias", "generated_code")}
  # Donated arguments are reused as outputs: count them once.
  out["total_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
  return out


_HLO_DTYPES = {"pred": "bool", "i1": "bool", "bf16": "bfloat16", "f16": "float16", "f32": "float32",
               "f64": "float64", "c64": "complex64", "c128": "complex128"}
_HLO_SHAPE = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_HLO_OP = re.compile(r"^\s+(?:ROOT\s+)?%?[\w.\-]+\s*=\s*((?:[^=\"]|/\*index=\d+\*/)+?)\s+"
                     r"(all-reduce|reduce-scatter|all-gather|all-to-all|collective-permute)(-start)?\(")
_HLO_CALLS = re.compile(r"\b(?:body|condition|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)")
_HLO_CALL_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_MLIR_OP = re.compile(r"\"?stablehlo\.(all_reduce|reduce_scatter|all_gather|all_to_all|collective_permute)\"?[\s(]")
_MLIR_TENSOR = re.compile(r"tensor<((?:\d+x)*)([a-z][a-z0-9]*)>")


def dtype_name(name: str) -> str:
  """HLO / StableHLO element type (f32, bf16, s32, ui32, i1, ...) -> numpy name."""
  if name in _HLO_DTYPES:
    return _HLO_DTYPES[name]
  m = re.fullmatch(r"(s|i|u|ui)(\d+)", name)
  return f"{'u' if m.group(1).startswith('u') else ''}int{m.group(2)}" if m else name


def _nbytes(dtype: str, dims: tuple[int, ...]) -> int:
  try:
    return math.prod(dims) * jnp.dtype(dtype).itemsize
  except TypeError:  # An element type numpy does not know: count a byte.
    return math.prod(dims)


def parse_compiled(text: str, num_devices: int) -> tuple[list[dict], int]:
  """Collectives of compiled HLO text (full buffers, whether inside a loop body) and the number of while loops."""
  computation, ops, calls, loop_roots = "", [], {}, set()
  for line in text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      computation = re.match(r"(?:ENTRY\s+)?%?([^\s(]+)", line).group(1)
      continue
    targets = _HLO_CALLS.findall(line) + [t.strip().lstrip("%") for group in _HLO_CALL_LISTS.findall(line)
                                          for t in group.split(",") if t.strip()]
    calls.setdefault(computation, set()).update(targets)
    if re.search(r"\swhile\(", line):
      loop_roots.update(re.findall(r"\b(?:body|condition)=%?([\w.\-]+)", line))
    if m := _HLO_OP.match(line):
      ops.append({"kind": m.group(2), "computation": computation,
                  "shapes": _hlo_buffers(m.group(1), m.group(2), bool(m.group(3)), _group_size(line, num_devices))})
  in_loop = _reachable(calls, loop_roots)
  for op in ops:
    op["in_loop"] = op.pop("computation") in in_loop
  return ops, sum(1 for line in text.splitlines() if re.search(r"\swhile\(", line))


def _hlo_buffers(shape: str, kind: str, is_async: bool, group: int) -> list[Shape]:
  """The full buffers of one collective, from its result shape."""
  if is_async and kind in ("all-gather", "collective-permute"):  # Result: (operands, outputs[, contexts]).
    shape = _top_level(shape)[1]
  shapes = [(dtype_name(t), tuple(int(d) for d in dims.split(",") if d)) for t, dims in _HLO_SHAPE.findall(shape)]
  if kind == "reduce-scatter":  # The result is one device's share; the input was `group` times larger.
    shapes = [(t, (dims[0] * group, *dims[1:]) if dims else dims) for t, dims in shapes]
  return shapes


def _top_level(tuple_shape: str) -> list[str]:
  """'(a, (b, c), d)' -> ['a', '(b, c)', 'd']."""
  inner, parts, depth, start = tuple_shape.strip()[1:-1], [], 0, 0
  for i, ch in enumerate(inner):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if ch == "," and depth == 0:
      parts.append(inner[start:i].strip())
      start = i + 1
  return parts + [inner[start:].strip()]


def _group_size(line: str, default: int) -> int:
  """Devices in one replica group of a collective's HLO line."""
  if m := re.search(r"replica_groups=\{\{([^}]*)\}", line):
    return len(m.group(1).split(","))
  if m := re.search(r"replica_groups=\[\d+,(\d+)\]<=", line):
    return int(m.group(1))
  return default  # replica_groups={}: every device.


def _reachable(calls: dict[str, set[str]], roots: set[str]) -> set[str]:
  """Computations called, directly or not, from `roots`."""
  seen, todo = set(), list(roots)
  while todo:
    if (name := todo.pop()) not in seen:
      seen.add(name)
      todo.extend(calls.get(name, ()))
  return seen


def parse_lowered(text: str) -> list[dict]:
  """Collectives of lowered StableHLO text, as the program hands them to the compiler (before any rewrite)."""
  lines, ops = text.splitlines(), []
  for i, line in enumerate(lines):
    if not (m := _MLIR_OP.search(line)):
      continue
    signature = line
    if line.rstrip().endswith("({"):  # A reduction region follows; the types come after it.
      signature = next((s for s in lines[i + 1:] if s.lstrip().startswith("})")), line)
    types = signature[signature.rfind(" : ") + 3:]
    operands, _, results = types.partition(" -> ")
    buffers = [[(dtype_name(t), tuple(int(d) for d in dims.split("x") if d)) for dims, t in _MLIR_TENSOR.findall(s)]
               for s in (operands, results or operands)]
    # The full side: the reduce-scatter input, the all-gather output.
    full = max(buffers, key=lambda shapes: sum(_nbytes(*shape) for shape in shapes))
    ops.append({"kind": m.group(1).replace("_", "-"), "in_loop": False, "shapes": full})
  return ops


def tally(ops: list[dict]) -> dict[str, dict[str, Any]]:
  """Per kind: instructions, bytes (tensor / scalar), instructions inside loop bodies, bytes per dtype."""
  out = {k: {"count": 0, "bytes": 0, "tensor_bytes": 0, "scalar_bytes": 0, "in_loop": 0, "dtypes": {}} for k in KINDS}
  for op in ops:
    entry = out[op["kind"]]
    entry["count"] += 1
    entry["in_loop"] += op["in_loop"]
    for t, dims in op["shapes"]:
      nbytes = _nbytes(t, dims)
      entry["bytes"] += nbytes
      entry["tensor_bytes" if dims else "scalar_bytes"] += nbytes
      entry["dtypes"][t] = entry["dtypes"].get(t, 0) + nbytes
  return out
