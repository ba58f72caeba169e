"""`python -m jaxdp.train --config CONFIG.py --workdir DIR [--config.key=value ...] [--cpu_devices N]`.

Flags -> config -> `train_and_evaluate(config, workdir)`: the training loop, also called by tests and
notebooks.
"""

import sys

from jaxdp import cpu_devices

if __name__ == "__main__":  # Before JAX is imported: XLA reads XLA_FLAGS only once.
  if (_count := cpu_devices.requested(sys.argv)) is not None:
    cpu_devices.simulate(_count)

import collections  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxdp import config as config_lib  # noqa: E402
from jaxdp import data, metrics, models, optim, parallel  # noqa: E402
from jaxdp import step as step_lib  # noqa: E402

log = logging.getLogger("jaxdp")


@dataclasses.dataclass
class Result:
  """What a finished run leaves: the final (device) state, its backend, the last eval metrics."""
  state: step_lib.TrainState
  backend: parallel.Backend
  eval_metrics: dict[str, float]


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Result:
  """Trains `config` for `num_train_steps`, evaluating periodically; writes WORKDIR/metrics.jsonl."""
  num_devices = config.parallel.get("num_devices", 0) or jax.device_count()
  layout = config_lib.validate(config, num_devices, jax.process_count())
  _check_workdir(workdir)
  backend = parallel.make_backend(config.parallel.backend, config.parallel.get("num_devices", 0))
  ds = data.load(config.dataset)
  model = models.get_model(config.model, ds.input_shape, ds.num_classes)
  tx = optim.make(config)
  state = backend.init(functools.partial(step_lib.init_state, jax.random.PRNGKey(config.seed), model=model, tx=tx))
  train_step = backend.map_train(functools.partial(step_lib.train_step, model=model, tx=tx))
  eval_step = backend.map_eval(functools.partial(step_lib.eval_step, model=model))
  evaluate = functools.partial(_evaluate, backend, eval_step, ds, config, layout)

  start = int(backend.get(state.step))
  batches = parallel.prefetch(backend, data.train_batches(
      ds, config.dataset.train_split, seed=config.seed, global_batch=layout.global_batch, start_step=start,
      process_index=jax.process_index(), process_count=jax.process_count()), config.parallel.prefetch)
  writer = metrics.JsonlWriter(workdir)
  in_flight: collections.deque = collections.deque()
  history: list = []
  eval_metrics: dict[str, float] = {}
  for step in range(start + 1, config.num_train_steps + 1):
    state, step_metrics = train_step(state, next(batches))
    in_flight.append(step_metrics)
    # Reading an older step's metrics bounds the steps in flight (many in flight deadlock fake devices).
    while len(in_flight) >= config.parallel.max_steps_in_flight:
      history.append(backend.get(in_flight.popleft()))
    if _itstime(step, config.log_every_steps, config.num_train_steps):
      history += [backend.get(m) for m in in_flight]
      in_flight.clear()
      writer.write(step, metrics.mean(history, "train"))
      log.info("step %d: %s", step, history[-1])
      history = []
    if _itstime(step, config.eval_every_steps, config.num_train_steps):
      eval_metrics = evaluate(state)
      writer.write(step, eval_metrics)
      log.info("step %d: %s", step, eval_metrics)
  return Result(state, backend, eval_metrics)


def _itstime(step: int, every: int, total: int) -> bool:
  """Periodic work runs every `every` steps and at the last step."""
  return step % every == 0 or step == total


def _evaluate(backend: parallel.Backend, eval_step, ds: data.Dataset, config: ml_collections.ConfigDict,
              layout: config_lib.Layout, state: step_lib.TrainState) -> dict[str, float]:
  """Loss and accuracy over every example of the eval split, each counted once."""
  batches = data.eval_batches(ds, config.dataset.eval_split, global_batch=layout.eval_global_batch,
                              process_index=jax.process_index(), process_count=jax.process_count())
  totals = None
  for batch in batches:
    sums = backend.get(eval_step(state, backend.put_batch(batch)))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return metrics.summarize_eval(totals)


def _check_workdir(workdir: str) -> None:
  """Fails early, with the path, when the workdir cannot be written."""
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise config_lib.ConfigError(f"workdir {workdir!r} is not writable: {e.strerror or e}") from None


def parse(argv: list[str]) -> tuple[ml_collections.ConfigDict, str]:
  """Command line -> (config, workdir); every mistake is a ConfigError naming the bad value."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "Path to a config .py file with get_config().",
                                  flag_values=fv, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "Directory for metrics.jsonl and checkpoints.", flag_values=fv)
  flags.DEFINE_integer("cpu_devices", None, "Simulate this many CPU devices (or JAXDP_CPU_DEVICES).",
                       flag_values=fv)
  try:
    fv(argv)
  except flags.Error as e:
    raise config_lib.ConfigError(str(e)) from None
  except (AttributeError, KeyError) as e:  # An override names a key the config does not have.
    raise config_lib.ConfigError(f"unknown config key '{_bad_override(argv, e)}") from None
  if not fv["config"].present:
    raise config_lib.ConfigError("--config is required (e.g. --config jaxdp/configs/default.py)")
  if not fv.workdir:
    raise config_lib.ConfigError("--workdir is required")
  path = fv["config"].config_filename
  if not os.path.isfile(path):
    raise config_lib.ConfigError(f"config file {path!r} not found")
  try:
    return fv.config, fv.workdir
  except Exception as e:  # The config file itself failed to load (syntax error, bad import, ...).
    raise config_lib.ConfigError(f"could not load config file {path!r}: {e.__cause__ or e}") from None


def _bad_override(argv: list[str], error: Exception) -> str:
  """The `--config.x.y` flag that failed with KeyError/AttributeError 'y', with ml_collections' hint."""
  key = re.search(r"\w+", str(error)).group()
  hint = re.search(r'Did you mean "(\w+)"', str(error))
  flag = next((a.split("=")[0].lstrip("-") for a in argv if re.match(rf"--config\.([\w.]+\.)?{key}\b", a)), key)
  return f"{flag}'" + (f" (did you mean {hint.group(1)!r}?)" if hint else "")


def main(argv: list[str]) -> int:
  """Runs the CLI; returns the exit status (2 for a config or command-line mistake)."""
  logging.basicConfig(format="%(message)s", stream=sys.stdout, force=True)
  log.setLevel(logging.INFO)  # jaxdp's own lines; libraries stay at WARNING.
  try:
    config, workdir = parse(argv)
    train_and_evaluate(config, workdir)
  except config_lib.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
