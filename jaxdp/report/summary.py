"""The short summary a run prints at start: devices, backend, batch layout, model size, data, compute."""

import collections
import math
import sys
from typing import Any, TextIO

import jax
import ml_collections
import numpy as np

from jaxdp import config as config_lib
from jaxdp import data, loss_scale, parallel, strategies
from jaxdp.report import units
from jaxdp.runtime import distributed
from jaxdp.models import Model


TOPIC_WIDTH = 9  # Fixed, so that lines printed later (e.g. "compute") align with the block.


def describe(config: ml_collections.ConfigDict, backend: parallel.Backend, layout: config_lib.Layout,
             ds: data.Dataset, model: Model, task: str = "") -> dict[str, str]:
  """Topic -> one line of text, in the order printed (the step's FLOPs later: `compute`); `task` from `tasks`."""
  count, nbytes = parameter_size(model)
  n_train = ds.num_examples(config.dataset.train_split)
  n_eval = ds.num_examples(config.dataset.eval_split)
  steps_per_epoch = n_train // layout.global_batch
  steps = f"{config.num_train_steps:,} step{'s' * (config.num_train_steps != 1)}"
  per_process = f" ({layout.process_batch} per process)" if layout.num_processes > 1 else ""
  targets = f"float labels {tuple(ds.label_shape)}" if ds.float_labels else f"{ds.num_classes} classes"
  return {
      "devices": _devices(backend),
      "backend": _backend(config.parallel.backend, backend, strategies.select(config).holds),
      "batch": (f"global {layout.global_batch} = {layout.num_devices} devices x {layout.per_device_batch}"
                f"{per_process}; eval global {layout.eval_global_batch}"),
      "model": f"{config.model.name}: {count:,} parameters, {units.binary_bytes(nbytes)}",
      "data": (f"{ds.name} {config.dataset.train_split!r} {n_train:,} examples, "
               f"{config.dataset.eval_split!r} {n_eval:,}; input {ds.input_shape}, {targets}"),
      **({"task": task} if task else {}),  # Which task runs and why, right after the data it reads.
      "features": features(ds),
      "schedule": (f"{steps}, {steps_per_epoch:,} per epoch "
                   f"(= {config.num_train_steps / max(steps_per_epoch, 1):.1f} epochs)"),
      **({"precision": scaled_precision()} if config.dtype == "float16" else {}),
  }


def scaled_precision() -> str:
  """The line of a float16 run: its loss scaling is on (`loss_scale`), and how it moves."""
  return (f"float16 compute under dynamic loss scaling: the loss x {loss_scale.INITIAL_SCALE:g} at first, the scale "
          f"halved at an overflow (that step skipped), doubled after {loss_scale.GROWTH_INTERVAL} finite steps "
          "(train/loss_scale)")


def features(ds: data.Dataset) -> str:
  """Each feature a batch holds (name, shape, dtype), then each one left out and why."""
  held = ", ".join(f"{k} {tuple(v.shape)} {np.dtype(v.dtype).name}" for k, v in ds.element_spec().items())
  left_out = ds.corpus.facts.left_out
  return held + ("; left out: " + ", ".join(f"{k} ({why})" for k, why in left_out.items()) if left_out else "")


def report(lines: dict[str, str], stream: TextIO | None = None, title: str | None = "jaxdp") -> None:
  """Prints the summary (or more lines of it) on process 0."""
  if jax.process_index() == 0:
    stream = stream if stream is not None else sys.stdout
    block = "".join(f"  {topic:<{TOPIC_WIDTH}} {text}\n" for topic, text in lines.items())
    stream.write((f"{title}\n" if title else "") + block)
    stream.flush()


def state_size(state: Any, backend: parallel.Backend) -> str:
  """What one device holds of the parameters and of the optimizer state (its shards), against the whole."""
  def held(tree: Any) -> str:  # A pmap leaf stacks one whole copy per local device.
    copies = len(backend.local_devices) if isinstance(backend, parallel.PmapBackend) else 1
    whole = sum(x.nbytes for x in jax.tree.leaves(tree)) // copies
    mine = tree_bytes(tree)
    sharded = f" of {units.binary_bytes(whole)} ({mine / whole:.1%})" if mine < whole else ""
    return units.binary_bytes(mine) + sharded
  return f"per device: parameters {held(state.params)}, optimizer state {held(state.opt_state)}"


def parameter_size(model: Model) -> tuple[int, int]:
  """(number, bytes) of the trainable parameters, from shapes alone (nothing is allocated)."""
  params, _ = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)), tree_bytes(params)


def tree_bytes(tree: Any) -> int:
  """Bytes of one device's pieces of every leaf of `tree` (a leaf's shard where it carries a sharding)."""
  leaves = jax.tree.leaves(tree)
  shapes = [x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape for x in leaves]
  return sum(math.prod(shape) * np.dtype(x.dtype).itemsize for shape, x in zip(shapes, leaves))


def _devices(backend: parallel.Backend) -> str:
  """The devices, how many each process has, and how many of those it could see this one took."""
  device = backend.devices[0]
  counts = sorted(set(collections.Counter(d.process_index for d in backend.devices).values()))
  processes = jax.process_count()
  spread = "1 process" if processes == 1 else f"{processes} processes of {counts[0]}" + (
      f" to {counts[-1]}" if len(counts) > 1 else "") + " devices"
  taken = len(backend.local_devices)
  seen = distributed.devices_seen(taken, device.platform)
  return (f"{backend.num_devices} x {device.device_kind} ({device.platform}); {spread}; this one has {taken} of "
          f"the {'?' if seen is None else seen} devices it can see")


def _backend(name: str, backend: parallel.Backend, holds: str) -> str:
  axes = ", ".join(f"{axis!r}: {size}" for axis, size in backend.mesh.shape.items())
  if name == "pmap":
    return f"pmap: jax.pmap over {backend.num_devices} devices (axis {axes}), one state copy per device"
  return f"{name}: jit(shard_map) over Mesh({{{axes}}}), {holds}, batch sharded"


def compute(step_flops: float | None, peak: float | None, device: jax.Device) -> str:
  """The step's FLOPs per device and whether MFU can be reported."""
  if step_flops is None:
    return "FLOPs per step unknown: no MFU"
  text = f"{units.si(step_flops)}FLOP per step per device (XLA cost analysis)"
  if peak is None:
    return text + f"; peak FLOP/s of {device.device_kind!r} unknown: no MFU"
  return text + f"; peak {units.si(peak)}FLOP/s per device (bf16): MFU reported"
