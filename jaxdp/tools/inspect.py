"""`python -m jaxdp.inspect --config CONFIG.py [--config.key=value ...] [--json] [--cpu_devices N]`.

Compiles the train step for the current devices without training, and reports what one optimizer
step costs: parameter and optimizer-state bytes, collectives by kind (count, bytes, dtypes; read from
the compiled HLO and from the lowered StableHLO), per-device memory (XLA's memory analysis) and FLOPs
(XLA's cost analysis). `analyze(config)` returns the same as a dict; `config.parallel.num_devices`
picks how many devices, so one process can compare N = 1, 2, 4, 8.
"""

import contextlib
import json
import math
import re
import sys
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxdp import build, parallel
from jaxdp.tools import cli
from jaxdp.report import flops, units
from jaxdp import config as config_lib

USAGE = ("python -m jaxdp.inspect --config CONFIG.py [--config.key=value ...] [--json] [--cpu_devices N] "
         "[--topology NAME [--max_batch]] [--project 8,64,512 [--interconnect NAME]]")
KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")
BYTES_NOTE = ("bytes = the full buffer of each collective (the all-reduced tensor, the reduce-scatter input, the "
              "all-gather output); tensor vs scalar: scalars (rank 0) are the step's metrics (loss, accuracy, "
              "finite flag), tensors are gradients, parameters, BatchNorm statistics")
Shape = tuple[str, tuple[int, ...]]  # (numpy dtype name, dims)


def analyze(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Compiles `config`'s train step (nothing runs) and measures it; raises ConfigError for a bad config."""
  parts = build.build(config)
  abstract = jax.eval_shape(parts.init)
  state, batch = abstract_inputs(parts, abstract)
  lowered = parts.train_step.lower(state, batch)
  compiled = lowered.compile()
  n = parts.backend.num_devices
  compiled_ops, loops = parse_compiled(compiled.as_text() or "", n)
  report = {
      "run": _run(config, parts),
      "params": {"count": sum(x.size for x in jax.tree.leaves(abstract.params)),
                 "bytes": _tree_bytes(abstract.params)},
      "optimizer_state_bytes": _tree_bytes(abstract.opt_state),
      "per_device": _per_device(parts.backend, abstract, state, batch),
      "flops_per_step": flops.compiled_flops(compiled),
      "memory": memory(compiled),
      "collectives": {"compiled": tally(compiled_ops), "lowered": tally(parse_lowered(lowered.as_text()))},
      "while_loops": loops,
  }
  report["notes"] = _notes(report, parts.backend.devices[0].platform)
  return report


def abstract_inputs(parts: build.Parts, abstract: Any) -> tuple[Any, dict[str, jax.ShapeDtypeStruct]]:
  """(state, batch) shapes laid out as the backend lays them out; batches as `preprocess.finish` makes them."""
  backend, layout, ds = parts.backend, parts.layout, parts.ds
  label_shape = tuple(ds.label_shape)
  shapes = {"inputs": (tuple(ds.input_shape), jnp.float32), "labels": (label_shape, jnp.int32)}
  if isinstance(backend, parallel.PmapBackend):  # One [local_devices] axis in front of everything.
    n = len(backend.local_devices)
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct((n, *x.shape), x.dtype), abstract)
    batch = {k: jax.ShapeDtypeStruct((n, layout.process_batch // n, *s), t) for k, (s, t) in shapes.items()}
    return state, batch
  batch = {k: jax.ShapeDtypeStruct((layout.global_batch, *s), t, sharding=backend.sharded)
           for k, (s, t) in shapes.items()}
  return backend.abstract_global(abstract), batch


def memory(compiled: Any) -> dict[str, int] | None:
  """Per-device bytes from XLA's memory analysis; None where the backend has none."""
  try:
    stats = compiled.memory_analysis()
  except (NotImplementedError, RuntimeError):
    return None
  if isinstance(stats, (list, tuple)):
    stats = stats[0] if stats else None
  if stats is None:
    return None
  out = {key: int(getattr(stats, f"{name}_size_in_bytes")) for key, name in (
      ("argument_bytes", "argument"), ("output_bytes", "output"), ("temp_bytes", "temp"),
      ("alias_bytes", "alias"), ("generated_code_bytes", "generated_code"))}
  # Donated arguments are reused as outputs: count them once.
  out["total_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
  return out


# --- Collectives from program text ---------------------------------------------------------------

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


def _itemsize(dtype: str) -> int:
  try:
    return jnp.dtype(dtype).itemsize
  except TypeError:  # An element type numpy does not know: count a byte.
    return 1


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
  if m := re.search(r"replica_groups=\{\{([^}]*)\}", line):
    return len(m.group(1).split(","))
  if m := re.search(r"replica_groups=\[\d+,(\d+)\]<=", line):
    return int(m.group(1))
  return default  # replica_groups={}: every device.


def _reachable(calls: dict[str, set[str]], roots: set[str]) -> set[str]:
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
    ops.append({"kind": m.group(1).replace("_", "-"), "in_loop": False,
                "shapes": max(buffers, key=_shapes_bytes)})  # The full side: reduce-scatter in, all-gather out.
  return ops


def _shapes_bytes(shapes: list[Shape]) -> int:
  return sum(math.prod(dims) * _itemsize(t) for t, dims in shapes)


def tally(ops: list[dict]) -> dict[str, dict[str, Any]]:
  """Per kind: instructions, bytes (tensor / scalar), instructions inside loop bodies, bytes per dtype."""
  out = {k: {"count": 0, "bytes": 0, "tensor_bytes": 0, "scalar_bytes": 0, "in_loop": 0, "dtypes": {}} for k in KINDS}
  for op in ops:
    entry = out[op["kind"]]
    entry["count"] += 1
    entry["in_loop"] += op["in_loop"]
    for t, dims in op["shapes"]:
      nbytes = math.prod(dims) * _itemsize(t)
      entry["bytes"] += nbytes
      entry["tensor_bytes" if dims else "scalar_bytes"] += nbytes
      entry["dtypes"][t] = entry["dtypes"].get(t, 0) + nbytes
  return out


# --- The report ----------------------------------------------------------------------------------

def _tree_bytes(tree: Any) -> int:
  """Bytes of one device's pieces of every leaf of `tree`."""
  return sum(_leaf_bytes(x) for x in jax.tree.leaves(tree))


def _leaf_bytes(x: Any) -> int:
  """Bytes of one device's piece of `x` (its shard when `x` carries a sharding)."""
  sharding = getattr(x, "sharding", None)
  shape = sharding.shard_shape(x.shape) if sharding is not None else x.shape
  return math.prod(shape) * np.dtype(x.dtype).itemsize


def _per_device(backend: parallel.Backend, abstract: Any, state: Any, batch: dict) -> dict[str, int]:
  """What one device holds of the state (mesh: its shards; pmap: one copy) and of the batch."""
  if isinstance(backend, parallel.PmapBackend):  # Leaves carry a [local_devices] axis: a device holds one row.
    state, batch = abstract, {k: jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for k, x in batch.items()}
  other = _tree_bytes(state) - _tree_bytes(state.params) - _tree_bytes(state.opt_state)
  return {"params_bytes": _tree_bytes(state.params), "opt_state_bytes": _tree_bytes(state.opt_state),
          "other_state_bytes": other, "batch_bytes": _tree_bytes(batch)}


def _run(config: ml_collections.ConfigDict, parts: build.Parts) -> dict[str, Any]:
  device = parts.backend.devices[0]
  return {"model": config.model.name, "backend": config.parallel.backend, "devices": parts.backend.num_devices,
          "platform": device.platform, "device_kind": device.device_kind, "optimizer": config.optimizer,
          "global_batch": parts.layout.global_batch, "per_device_batch": parts.layout.per_device_batch,
          "grad_accum_steps": config.get("grad_accum_steps", 1), "dtype": config.get("dtype", "float32"),
          "allreduce_dtype": config.parallel.get("allreduce_dtype", "float32"),
          "shard_optimizer_state": bool(config.parallel.get("shard_optimizer_state", False))}


def _notes(report: dict, platform: str) -> list[str]:
  notes = [BYTES_NOTE]
  compiled, lowered = report["collectives"]["compiled"], report["collectives"]["lowered"]
  for kind in KINDS:
    sent, kept = sorted(lowered[kind]["dtypes"]), sorted(compiled[kind]["dtypes"])
    if sent != kept:
      notes.append(f"{kind}: the lowered program sends {', '.join(sent) or 'nothing'}, the program compiled for "
                   f"{platform} sends {', '.join(kept) or 'nothing'}: the compiler changed the dtype (XLA:CPU "
                   "promotes bfloat16 all-reduces to float32; the lowered dtype is what the step asks for)")
  looped = sum(c["in_loop"] for c in compiled.values())
  if looped:
    notes.append(f"{looped} compiled collective(s) sit inside a loop body and run once per iteration, "
                 "not once per step")
  if report["while_loops"]:  # e.g. the lax.scan over micro-batches of grad_accum_steps.
    notes.append("FLOPs: XLA's cost analysis counts a loop body once, not once per iteration; with "
                 f"grad_accum_steps = {report['run']['grad_accum_steps']} the forward/backward is counted for "
                 "one micro-batch only")
  return notes


def format_report(r: dict) -> str:
  """The report as aligned text."""
  run, mem, dev = r["run"], r["memory"], r["per_device"]
  size = units.binary_bytes
  flops_text = f"{units.si(r['flops_per_step'])}FLOP per device" if r["flops_per_step"] else "unknown"
  lines = [
      f"jaxdp inspect: {run['model']} on {run['devices']} x {run['device_kind']} ({run['platform']}), "
      f"backend {run['backend']}, batch {run['global_batch']} = {run['devices']} x {run['per_device_batch']}",
      f"  options     accum {run['grad_accum_steps']}, dtype {run['dtype']}, all-reduce {run['allreduce_dtype']}, "
      f"ZeRO-1 {'on' if run['shard_optimizer_state'] else 'off'}, optimizer {run['optimizer']}",
      f"  parameters  {r['params']['count']:,} ({size(r['params']['bytes'])}); optimizer state "
      f"{size(r['optimizer_state_bytes'])}",
      f"  per device  params {size(dev['params_bytes'])}, optimizer state {size(dev['opt_state_bytes'])}, "
      f"other state {size(dev['other_state_bytes'])}, batch {size(dev['batch_bytes'])}",
      f"  FLOPs/step  {flops_text} (XLA cost analysis)",
      "  memory      " + (f"argument {size(mem['argument_bytes'])}, output {size(mem['output_bytes'])}, temp "
                          f"{size(mem['temp_bytes'])}, alias (donated) {size(mem['alias_bytes'])}, total "
                          f"{size(mem['total_bytes'])} per device (XLA memory analysis)" if mem else "unknown"),
      "",
      f"  {'collectives per step':<28}{'count':>6}{'bytes':>12}{'tensor':>12}{'scalar':>9}{'in loop':>9}  dtypes",
  ]
  for program in ("compiled", "lowered"):
    rows = [(k, c) for k, c in r["collectives"][program].items() if c["count"]]
    lines += [f"  {f'{program} {k}':<28}{c['count']:>6}{size(c['bytes']):>12}{size(c['tensor_bytes']):>12}"
              f"{size(c['scalar_bytes']):>9}{c['in_loop'] if program == 'compiled' else '-':>9}  "
              + ", ".join(c["dtypes"]) for k, c in rows] or [f"  {program}: none"]
  return "\n".join(lines + [""] + [f"  note: {n}" for n in r["notes"]])



def main(argv: list[str]) -> int:
  """Runs the CLI; returns the exit status (2 for a config or command-line mistake)."""
  from jaxdp.tools import projection, topology  # They build on this module's parsers: imported here, no import cycle.
  as_json = "--json" in argv[1:]
  try:
    argv, target, search = topology.split_flags(argv)  # --topology NAME [--max_batch]: jaxdp.topology reports.
    argv, counts, link = projection.split_flags(argv)  # --project COUNTS [--interconnect NAME]: jaxdp.projection.
    config, _ = cli.parse([a for a in argv if a != "--json"], require_workdir=False, usage=USAGE,
                          extra_help="  --json: print the report as JSON.\n  --topology NAME: compile for a TPU "
                          "slice ahead of time (e.g. v5e:4x4): will it fit?\n  --max_batch: with --topology, the "
                          "largest global batch that fits.\n  --project 8,64,512: project step time and scaling "
                          "efficiency to those device counts (alpha-beta model, compute measured here).\n  "
                          f"--interconnect NAME: with --project, one of {', '.join(projection.INTERCONNECTS)}.")
    with contextlib.redirect_stdout(sys.stderr):  # Dataset preparation messages must not mix into the report.
      report = topology.run(config, target, search) if target else None
      text = topology.format_report if report else format_report
      if counts and not report:
        report, text = projection.project(config, counts, link), projection.format_report
      report = report or analyze(config)
  except config_lib.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(report, indent=2) if as_json else text(report))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
