"""orbax checkpoints under WORKDIR/checkpoints/: each entry the full TrainState (global arrays), its input stream and
config; asynchronous saves; an entry cut off by a kill is never listed (orbax renames it to its step when complete)."""

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from orbax.checkpoint import checkpoint_managers

from jaxdp.config import ConfigError
from jaxdp.optim import parameter_path
from jaxdp.parallel import Backend
from jaxdp.step import PLAIN, TrainState
from jaxdp.strategies import Strategy

CHECKPOINT_DIR = "checkpoints"
BEST_MODES = ("max", "min")


def _one_replica_per_process(x: Any) -> Any:
  """A replicated array as the same array on one device of each process (no copy); any other leaf as it is.

  orbax divides the writing of a replicated array among its replicas, with a slice per replica: each a program
  compiled for its shape, and on one process no less to write. One replica per process keeps the division across
  processes, where it spreads the work, and drops the slices within one."""
  if not isinstance(x, jax.Array) or not x.sharding.is_fully_replicated or len(x.sharding.device_set) == 1:
    return x
  first = {}  # Each process's first device, by id: the same choice in every process.
  for device in sorted(x.sharding.device_set, key=lambda d: d.id):
    first.setdefault(device.process_index, device)
  sharding = NamedSharding(Mesh(np.array(list(first.values())), ("replica",)), P())
  mine = first[jax.process_index()]
  return jax.make_array_from_single_device_arrays(x.shape, sharding,
                                                  [s.data for s in x.addressable_shards if s.device == mine])


def directory(workdir: str) -> str:
  """WORKDIR/checkpoints, absolute: where a workdir's entries live."""
  return os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))


def steps(workdir: str) -> list[int]:
  """The steps of a workdir's complete checkpoints, oldest first (orbax renames an entry to its step when done)."""
  try:
    return sorted(int(name) for name in os.listdir(directory(workdir)) if name.isdigit())
  except OSError:
    return []


def pick_step(workdir: str, step: int | None = None) -> int:
  """`step` (default: the newest) if WORKDIR holds that checkpoint; else a ConfigError naming the steps it has."""
  have = steps(workdir)
  if not have:
    raise ConfigError(f"no checkpoint in workdir {workdir!r} (train with checkpoint_every_steps > 0)")
  step = have[-1] if step is None else step
  if step not in have:
    raise _no_step(directory(workdir), step, have)
  return step


def _no_step(path: str, step: int, have: list[int]) -> ConfigError:
  return ConfigError(f"no checkpoint {step} in {path} (have: {sorted(have)})")


class Checkpointer:
  """Saves and restores the training state of one workdir."""

  def __init__(self, workdir: str, config: ml_collections.ConfigDict):
    self.directory = directory(workdir)
    self.config = config
    self.stream: dict[str, Any] | None = None  # The run's `data.stream_spec`, stored with each save.
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=True,  # Training goes on while a save is written; `wait` blocks for it.
        preservation_policy=_preservation_policy(config), cleanup_tmp_directories=True)
    # Handlers named up front, so that a fresh manager can read an existing entry's metadata.
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
    self._closed = False

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self.manager.latest_step()

  def restore_or_init(self, backend: Backend, init: Callable[[], TrainState], step: int | None = None,
                      strategy: Strategy = PLAIN, params_only: bool = False) -> TrainState:
    """Checkpoint `step` (default: the newest), else a fresh `init()`, placed for `backend`; `params_only`: the stored
    optimizer state is not read (what evaluating and sampling need). A ConfigError closes the manager first."""
    try:
      step = self.latest_step() if step is None else step
      if step is None:
        return backend.init(init)
      if params_only:
        return self._restore_params(step, backend, init)
      return self._restore(step, backend, init, strategy)
    except BaseException:
      self.close()  # The caller never got a state, so it will not close what it cannot use.
      raise

  def stored_meta(self, step: int) -> dict[str, Any]:
    """What `save` wrote beside the state: step, config, input stream."""
    if step not in self.manager.all_steps():
      raise _no_step(self.directory, step, list(self.manager.all_steps()))
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def save(self, step: int, state: TrainState, backend: Backend, metrics: Mapping[str, float] | None = None) -> None:
    """Starts writing `state` as entry `step` (asynchronously); a no-op if that entry exists."""
    if step in self.manager.all_steps():
      return
    meta = {"step": step, "config": json.loads(self.config.to_json_best_effort())}
    if self.stream is not None:
      meta["stream"] = self.stream
    written = jax.tree.map(_one_replica_per_process, backend.to_global(state))
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(written),
                                                    meta=ocp.args.JsonSave(meta)),
                      metrics=dict(metrics) if metrics else None, force=True)  # Whatever step orbax saved last.

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are written."""
    self.manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases the manager; a second call does nothing."""
    if not self._closed:
      self._closed = True
      self.manager.close()

  def _restore(self, step: int, backend: Backend, init: Callable[[], TrainState], strategy: Strategy) -> TrainState:
    wanted = jax.eval_shape(init)
    stored = _leaves(self.manager.item_metadata(step)["state"].tree)
    opt_leaf = lambda path: stored.get(parameter_path(("opt_state", *path)))  # noqa: E731
    as_stored = wanted.replace(opt_state=strategy.stored_opt_layout(wanted, opt_leaf))
    self._check_fits(step, stored, as_stored)
    target = backend.abstract_global(wanted)
    if as_stored.opt_state is wanted.opt_state:
      return backend.from_global(self._read(step, target))
    # The optimizer state was laid out for another device count (ZeRO-1): read it whole, lay it out anew.
    replicated = NamedSharding(backend.mesh, P())
    source = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), as_stored.opt_state)
    state = self._read(step, target.replace(opt_state=source))
    shardings = jax.tree.map(lambda x: x.sharding, target.opt_state)
    opt_state = strategy.relayout_opt_state(state.opt_state, wanted, shardings)
    return backend.from_global(state.replace(opt_state=opt_state))

  def _read(self, step: int, abstract: TrainState) -> TrainState:
    return self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]

  def _restore_params(self, step: int, backend: Backend, init: Callable[[], TrainState]) -> TrainState:
    wanted = jax.eval_shape(init)
    stored = {k: v for k, v in _leaves(self.manager.item_metadata(step)["state"].tree).items()
              if not k.startswith("opt_state/")}
    self._check_fits(step, stored, wanted.replace(opt_state=()))
    target = backend.abstract_global(wanted)
    fields = {f.name: getattr(target, f.name) for f in dataclasses.fields(target) if f.name != "opt_state"}
    # The standard handler reads whole trees only; the pytree one skips the stored optimizer state.
    restore = ocp.args.PyTreeRestore(fields, restore_args=ocp.checkpoint_utils.construct_restore_args(fields),
                                     partial_restore=True)
    with ocp.CheckpointManager(self.directory, item_handlers={"state": ocp.PyTreeCheckpointHandler()}) as reader:
      read = reader.restore(step, args=ocp.args.Composite(state=restore))["state"]
    return backend.from_global(target.replace(**read, opt_state=wanted.opt_state))  # A stateless optimizer's.

  def _check_fits(self, step: int, stored: dict[str, Any], abstract: TrainState) -> None:
    """Raises a ConfigError naming what differs when the checkpoint does not fit the config."""
    stored = {k: _describe(v) for k, v in stored.items()}
    wanted = {k: _describe(v) for k, v in _leaves(abstract).items()}
    diffs = [(k, f"{k} is missing from the checkpoint") for k in wanted.keys() - stored.keys()]
    diffs += [(k, f"{k} is in the checkpoint, not in the config's model") for k in stored.keys() - wanted.keys()]
    diffs += [(k, f"{k} is {stored[k]} in the checkpoint, {wanted[k]} in the config")
              for k in wanted.keys() & stored.keys() if stored[k] != wanted[k]]
    # Parameters first: they say what differs; optimizer-state paths only repeat them.
    diffs = [text for key, text in sorted(diffs, key=lambda d: (not d[0].startswith("params/"), d[0]))]
    if diffs:
      more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
      raise ConfigError(f"checkpoint {self.directory}/{step} does not fit the config: {'; '.join(diffs[:3])}{more}"
                        " (use another --workdir; the checkpoint is left untouched)")


def _leaves(tree: Any) -> dict[str, Any]:
  """'path/to/leaf' -> leaf for every array leaf of a state (its paths read as the stored metadata's) or metadata."""
  if isinstance(tree, TrainState):
    tree = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
  leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))
  return {parameter_path(path): x for path, x in leaves}


def _describe(x: Any) -> str:
  """'float32[3,4]'; a typed PRNG key as orbax stores it, by its raw key data ('uint32[2]' for key<fry>[])."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype))
  return f"{np.dtype(x.dtype).name}{list(x.shape)}"


def check_best(config: ml_collections.ConfigDict, eval_metrics: Sequence[str] | None = None) -> None:
  """`best_mode` max or min; `best_metric` one of the task's `eval_metrics` when best checkpoints are kept."""
  metric, mode = config.best_metric, config.best_mode
  if mode not in BEST_MODES:
    raise ConfigError(f"best_mode must be one of {', '.join(BEST_MODES)}, got {mode!r}")
  known = [k for k in eval_metrics or () if k != "eval/num_examples"]
  if eval_metrics is not None and config.keep_best_checkpoints and metric not in known:
    raise ConfigError(f"best_metric must be an eval metric of the task ({', '.join(known)}), got {metric!r}")


def _preservation_policy(config: ml_collections.ConfigDict) -> checkpoint_managers.PreservationPolicy:
  """Keep the newest `keep_checkpoints`, plus the `keep_best_checkpoints` best by `best_metric`."""
  check_best(config)
  policies: list = [checkpoint_managers.LatestN(n=config.keep_checkpoints)]
  if config.keep_best_checkpoints:
    metric, mode = config.best_metric, config.best_mode
    policies.append(checkpoint_managers.BestN(get_metric_fn=lambda m: m[metric], reverse=mode == "min",
                                              n=config.keep_best_checkpoints,
                                              keep_checkpoints_without_metrics=False))
  return checkpoint_managers.AnyPreservationPolicy(policies)
