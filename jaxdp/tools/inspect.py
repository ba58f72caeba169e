"""`python -m jaxdp.inspect --config CONFIG.py`: what one train step holds, sends and costs, compiled but never run."""

import argparse
import contextlib
import json
import sys
from typing import Any

import jax
import ml_collections

from jaxdp import build, parallel
from jaxdp import config as config_lib
from jaxdp.report import flops, summary, units
from jaxdp.tools import cli, hlo, topology

USAGE = ("python -m jaxdp.inspect --config CONFIG.py [--config.key=value ...] [--json] [--cpu_devices N] "
         "[--topology NAME [--max_batch]]")
KINDS = hlo.KINDS  # The report's rows, one per kind of collective (tests and scripts read inspect.KINDS).
BYTES_NOTE = ("bytes = the full buffer of each collective (the all-reduced tensor, the reduce-scatter input, the "
              "all-gather output); tensor vs scalar: scalars (rank 0) are the step's metrics (the loss, the "
              "task's metrics, the finite flag), tensors are gradients, parameters, BatchNorm statistics")


def analyze(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Compiles `config`'s train step (nothing runs) and measures it; raises ConfigError for a bad config."""
  parts = build.build(config)
  abstract = jax.eval_shape(parts.init)
  state, batch = hlo.abstract_inputs(parts, abstract)
  lowered = parts.train_step.lower(state, batch)
  compiled = lowered.compile()
  n = parts.backend.num_devices
  compiled_ops, loops = hlo.parse_compiled(compiled.as_text() or "", n)
  report = {
      "run": hlo.run_options(parts),
      "params": {"count": sum(x.size for x in jax.tree.leaves(abstract.params)),
                 "bytes": summary.tree_bytes(abstract.params)},
      "optimizer_state_bytes": summary.tree_bytes(abstract.opt_state),
      "per_device": _per_device(parts.backend, abstract, state, batch),
      "flops_per_step": flops.compiled_flops(compiled),
      "memory": hlo.memory(compiled),
      "collectives": {"compiled": hlo.tally(compiled_ops),
                      "lowered": hlo.tally(hlo.parse_lowered(lowered.as_text()))},
      "while_loops": loops,
  }
  report["notes"] = _notes(report, parts.backend.platform)
  return report


def _per_device(backend: parallel.Backend, abstract: Any, state: Any, item: tuple) -> dict[str, int]:
  """What one device holds of the state (mesh: its shards; pmap: one copy) and of a step's batch (a block of one)."""
  batch = item[0]
  if isinstance(backend, parallel.PmapBackend):  # Leaves carry a [local_devices] axis: a device holds one row.
    state, batch = abstract, {k: jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for k, x in batch.items()}
  size = summary.tree_bytes
  other = size(state) - size(state.params) - size(state.opt_state)
  return {"params_bytes": size(state.params), "opt_state_bytes": size(state.opt_state),
          "other_state_bytes": other, "batch_bytes": size(batch)}


def _notes(report: dict, platform: str) -> list[str]:
  """What the numbers mean and where the compiled program differs from the lowered one."""
  notes = [BYTES_NOTE]
  compiled, lowered = report["collectives"]["compiled"], report["collectives"]["lowered"]
  for kind in KINDS:
    sent, kept = sorted(lowered[kind]["dtypes"]), sorted(compiled[kind]["dtypes"])
    if sent != kept:
      notes.append(f"{kind}: the lowered program sends {', '.join(sent) or 'nothing'}, the program compiled for "
                   f"{platform} sends {', '.join(kept) or 'nothing'}: the compiler changed the dtype (XLA:CPU "
                   "promotes bfloat16 all-reduces to float32; the lowered dtype is what the step asks for)")
  if report["run"]["shard_params"]:
    notes.append(_against_plain(compiled, report["params"]["bytes"]))
  looped = sum(c["in_loop"] for c in compiled.values())
  if looped:
    notes.append(f"{looped} compiled collective(s) sit inside a loop body and run once per iteration, "
                 "not once per step")
  if report["while_loops"]:  # e.g. the lax.scan over micro-batches of grad_accum_steps.
    notes.append("FLOPs: XLA's cost analysis counts a loop body once, not once per iteration; with "
                 f"grad_accum_steps = {report['run']['grad_accum_steps']} the forward/backward is counted for "
                 "one micro-batch only")
  return notes


def _against_plain(compiled: dict, params_bytes: int) -> str:
  """shard_params' gathers and reduce-scatters, in parameter bytes: plain DDP all-reduces them once a step."""
  moved = {kind: compiled[kind]["tensor_bytes"] / max(params_bytes, 1) for kind in ("all-gather", "reduce-scatter")}
  return (f"shard_params: {compiled['all-gather']['count']} all-gathers move {moved['all-gather']:.2f}x the parameter "
          f"bytes (the backward pass gathers again what the compiler does not keep), {compiled['reduce-scatter']['count']} reduce-scatters "
          f"{moved['reduce-scatter']:.2f}x; plain DDP all-reduces 1x (an all-reduce moves about twice what a "
          "reduce-scatter or an all-gather does)")


def format_report(r: dict) -> str:
  """The report as aligned text."""
  run, mem, dev = r["run"], r["memory"], r["per_device"]
  size = units.binary_bytes
  flops_text = f"{units.si(r['flops_per_step'])}FLOP per device" if r["flops_per_step"] else "unknown"
  lines = [
      f"jaxdp inspect: {run['model']} on {run['devices']} x {run['device_kind']} ({run['platform']}), "
      f"backend {run['backend']}, batch {run['global_batch']} = {run['devices']} x {run['per_device_batch']}",
      f"  options     accum {run['grad_accum_steps']}, dtype {run['dtype']}, all-reduce {run['allreduce_dtype']}, "
      f"ZeRO-1 {'on' if run['shard_optimizer_state'] else 'off'}, shard_params "
      f"{'on' if run['shard_params'] else 'off'}, optimizer {run['optimizer']}",
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
  """Runs the CLI; returns the exit status (`cli.guarded`: 2 and one `error:` line for a config mistake)."""
  return cli.guarded(lambda: _command(argv))


def split_flags(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  """inspect's own flags, checked, and `argv` without them (for `cli.parse`)."""
  if moved := [a for a in argv[1:] if a.split("=")[0] in ("--project", "--interconnect")]:
    raise config_lib.ConfigError(f"{moved[0].split('=')[0]} moved to benchmarks/: python benchmarks/projection.py "
                                 "--project 8,64,512 [--interconnect NAME] --config CONFIG.py")
  parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
  parser.add_argument("--topology", nargs="?", const="")  # nargs="?": a flag given without its value is named.
  for flag in ("--json", "--max_batch"):
    parser.add_argument(flag, action="store_true")
  ours, rest = cli.own_flags(argv, parser)
  if ours.topology == "":
    raise config_lib.ConfigError(f"--topology needs a name; accepted forms: {topology.ACCEPTED}")
  if ours.max_batch and ours.topology is None:
    raise config_lib.ConfigError("--max_batch searches the largest batch for a --topology; name one "
                                 "(e.g. --topology v5e:4x4)")
  return ours, rest


def _command(argv: list[str]) -> None:
  """Parses `argv`, makes the report its flags ask for and prints it (as JSON with --json)."""
  ours, argv = split_flags(argv)
  config, _ = cli.parse(argv, require_workdir=False, usage=USAGE,
                        extra_help="  --json: print the report as JSON.\n  --topology NAME: compile for a TPU "
                        "slice ahead of time (e.g. v5e:4x4): will it fit?\n  --max_batch: with --topology, the "
                        "largest global batch that fits.")
  with contextlib.redirect_stdout(sys.stderr):  # Dataset preparation messages must not mix into the report.
    if ours.topology and (report := topology.slice_report(config, ours.topology, ours.max_batch)) is not None:
      text = topology.format_report
    else:  # No option, or a GPU --topology (slice_report said why): this machine's devices.
      report, text = analyze(config), format_report
  print(json.dumps(report, indent=2) if ours.json else text(report))


if __name__ == "__main__":
  sys.exit(main(sys.argv))
