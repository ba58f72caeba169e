"""The command line the tools share (`--config FILE [--workdir DIR] ...` -> config, workdir) and their error path."""

import argparse
import ast
import difflib
import gc
import inspect
import os
import re
import sys
from collections.abc import Callable

import ml_collections
from absl import flags
from ml_collections import config_flags

from jaxdp import config as config_lib
from jaxdp.runtime import cpu_devices, exits, process, quiet
from jaxdp.tools import restore

HELP_FLAGS = ("-h", "--help", "--helpshort", "--helpfull", "-help", "-helpfull")
NEW_KEY_SECTIONS = ("model", "task", "optimizer_kwargs")  # Sections whose new keys are keyword arguments.
OVERRIDES_HELP = ("  --config.KEY=VALUE: overrides any field of the config (e.g. --config.batch_size=256);\n"
                  "    config.model, config.task and config.optimizer_kwargs also take new keys, passed to the model,\n"
                  "    the task or the optimizer as keyword arguments (e.g. --config.model.dense=64,\n"
                  "    --config.task.gamma=2.0, --config.optimizer_kwargs.b1=0.95).")

def parse(argv: list[str], require_workdir: bool = True, *, usage: str = "",
          extra_help: str = "") -> tuple[ml_collections.ConfigDict, str | None]:
  """Command line -> (config, workdir); a mistake is a ConfigError naming the bad value; `--help` exits 0."""
  start(argv, usage, extra_help)
  _simulate_devices(argv)  # First: a config file may already ask JAX for devices.
  config, workdir = _load([a for a in argv if not a.startswith("--config.")], require_workdir)
  path = flag_value(argv, "config")
  return _override(config, [a for a in argv if a not in ("--config", f"--config={path}", path)]), workdir


def start(argv: list[str], usage: str = "", extra_help: str = "") -> None:
  """A command's first step: the flags printed and exit 0 if `argv` asks for help, else the libraries' noise off."""
  # Before the heavy imports (`--help` answers at once) and before JAX loads (`quiet.command`).
  if any(a in HELP_FLAGS for a in argv[1:]):
    program = "jaxdp." + os.path.basename(argv[0] if argv else "train").removeprefix("jaxdp.").removesuffix(".py")
    fv = _define(["help"])
    lines = [f"usage: {usage or f'python -m {program} --config CONFIG.py [flags]'}", "", "flags:",
             *(f"  --{name}: {fv[name].help}" for name in ("config", "workdir", "cpu_devices")), OVERRIDES_HELP]
    print("\n".join(lines + ([extra_help] if extra_help else [])))
    raise SystemExit(0)
  quiet.command()


def _simulate_devices(argv: list[str]) -> None:
  """Simulated CPU devices (`--cpu_devices N` or JAXDP_CPU_DEVICES), set up before JAX starts."""
  if (count := cpu_devices.requested(argv)) is not None:
    cpu_devices.simulate(count, cpu_devices.source(argv))


def parse_workdir(argv: list[str], step: int | None = None) -> tuple[ml_collections.ConfigDict, str]:
  """A trained workdir's command line -> (config, workdir): `--config FILE`, else checkpoint `step`'s stored config."""
  if any(a == "--config" or a.startswith("--config=") for a in argv):
    return parse(argv)
  _simulate_devices(argv)
  if not (workdir := flag_value(argv, "workdir")):
    raise config_lib.ConfigError("--workdir is required")
  return _override(restore.stored_config(workdir, step), argv, f" for the config stored in {workdir!r}"), workdir


def flag_value(argv: list[str], name: str) -> str | None:
  """The value of `--NAME VALUE` or `--NAME=VALUE` (or `-NAME`) among `argv`, before any parser reads it; else None."""
  for arg, following in zip(argv, [*argv[1:], "-"]):
    if arg in (f"--{name}", f"-{name}") and not following.startswith("-"):
      return following
    if arg.startswith((f"--{name}=", f"-{name}=")):
      return arg.split("=", 1)[1]
  return None


def workdir_tool(argv: list[str], *, usage: str, extra_help: str, flags: Callable[[argparse.ArgumentParser], None],
                 command: Callable[[argparse.Namespace, ml_collections.ConfigDict, str], None]) -> int:
  """A tool on a trained workdir: its own `flags` (and `--step`), the stored config, then `command`; the status."""

  def run() -> None:
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--step", type=int, default=None)
    flags(parser)
    ours, rest = own_flags(argv, parser)
    command(ours, *parse_workdir(rest, ours.step))

  return execute(argv, usage, extra_help, run)


def own_flags(argv: list[str], parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[str]]:
  """(a tool's own flags, `argv` without them); a bad value is a ConfigError (with `exit_on_error=False`)."""
  try:
    ours, rest = parser.parse_known_args(argv[1:])
  except argparse.ArgumentError as e:
    raise config_lib.ConfigError(str(e)) from None
  return ours, argv[:1] + rest


def execute(argv: list[str], usage: str, extra_help: str, run: Callable[[], None],
            failures: tuple[type[Exception], ...] = ()) -> int:
  """`--help` answered, then the logging set up (it loads JAX), then `run` under `guarded`."""
  start(argv, usage, extra_help)
  process.setup_logging()
  return guarded(run, failures)


def guarded(run: Callable[[], int | None], failures: tuple[type[Exception], ...] = ()) -> int:
  """`run()`'s status (None: 0): ConfigError one `error:` line and 2, `failures` one line and 1, others reported, 1."""
  try:
    return run() or 0
  except config_lib.ConfigError as e:
    status, line, error = 2, str(e), e
  except Exception as e:  # Reported, and the process still ends.
    distributed = sys.modules.get("jaxdp.runtime.distributed")  # A failed join: loaded once the run tried one.
    one_line = (*failures, *([distributed.DistributedInitError] if distributed else []))
    status, line, error = 1, str(e) if isinstance(e, one_line) else None, e
  if line is None:
    exits.report(error)
  else:
    print(f"error: {line}", file=sys.stderr)
  exits.release(error)  # Frees what the error held (its frames): no process hangs on them.
  del error
  gc.collect()  # Reference cycles through the released frames: collected now, not at interpreter exit.
  return status


def _define(argv: list[str], stored: ml_collections.ConfigDict | None = None) -> flags.FlagValues:
  """The flags: `--config` a config file's, or (`stored`) a checkpoint's config; `--workdir`; `--cpu_devices`."""
  fv = flags.FlagValues()
  if stored is None:
    config_flags.DEFINE_config_file("config", None, "Path to a config .py file with get_config().",
                                    flag_values=fv, sys_argv=argv)
  else:
    config_flags.DEFINE_config_dict("config", stored, flag_values=fv, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "Directory for metrics.jsonl and checkpoints.", flag_values=fv)
  flags.DEFINE_integer("cpu_devices", None, f"Simulate this many CPU devices (or {cpu_devices.ENV_VAR}).",
                       flag_values=fv)
  return fv


def _load(argv: list[str], require_workdir: bool) -> tuple[ml_collections.ConfigDict, str | None]:
  """(the config file's config, --workdir); a flag missing, or a missing or broken file, is a ConfigError naming it."""
  fv = _define(argv)
  try:
    fv(argv)
  except flags.Error as e:
    # ml_collections re-raises a TypeError or ValueError of the config file's own code with its traceback.
    if not (isinstance(raised := e.__context__, (TypeError, ValueError))
            and "Error whilst parsing config file" in str(raised)):
      raise config_lib.ConfigError(str(e)) from None
    why = str(raised).strip().splitlines()[-1]
  except Exception as e:  # The config file itself failed to load, as it is parsed (a syntax error, a bad import...).
    why = e
  else:
    if not fv["config"].present:
      raise config_lib.ConfigError("--config is required (e.g. --config jaxdp/configs/default.py)")
    if require_workdir and not fv.workdir:
      raise config_lib.ConfigError("--workdir is required")
    if not os.path.isfile(path := fv["config"].config_filename):
      raise config_lib.ConfigError(f"config file {path!r} not found")
    try:
      if isinstance(config := fv.config, ml_collections.ConfigDict):
        return config, fv.workdir
      if config is not None:  # ml_collections defers an IOError of get_config to the config's first use: here.
        config.keys()
      raise TypeError(f"get_config() returned {config!r}, not a ConfigDict")
    except Exception as e:  # The config file itself failed to load (syntax error, bad import, ...).
      why = e.__cause__ or e
  raise config_lib.ConfigError(f"could not load config file {flag_value(argv, 'config')!r}: {why}") from None


def _override(config: ml_collections.ConfigDict, argv: list[str], where: str = "") -> ml_collections.ConfigDict:
  """`config` with `argv`'s `--config.KEY=VALUE`: by the declared type, else (unset field, new key) as a literal."""
  rest, model_keys = [], []
  for arg in argv:
    path, sep, text = arg.removeprefix("--config.").partition("=")
    *parents, key = path.split(".")
    node = config
    for part in parents:
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    new = len(parents) == 1 and parents[0] in NEW_KEY_SECTIONS and (node is None or key not in node)
    if not (arg.startswith("--config.") and sep and (new or isinstance(node, ml_collections.ConfigDict)
                                                    and key in node and node.get_type(key) is type(None))):
      rest.append(arg)  # absl reads VALUE by the field's declared type.
      continue
    if node is None:
      with config.unlocked():
        config[parents[0]] = node = ml_collections.ConfigDict()
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):  # Not a Python literal: the plain string.
      value = text
    with node.unlocked():
      node[key] = value
    model_keys += [key] if new and parents == ["model"] else []
  try:
    _define(rest, config)(rest)  # The overrides are applied to `config` as the flag is defined, and again here.
  except flags.Error as e:
    raise config_lib.ConfigError(f"{e}{where}") from None
  except (AttributeError, KeyError) as e:  # An override names a key the config does not have.
    if (key := _bad_override(rest, e)) in config_lib.REMOVED:
      raise config_lib.removed(key) from None
    raise config_lib.ConfigError(f"{config_lib.unknown(key)}{where}") from None
  except TypeError as e:  # An override reaches into a field that is no dict (--config.dataset.name.x=1).
    overrides = ", ".join(a.split("=")[0] for a in rest if a.startswith("--config."))
    raise config_lib.ConfigError(f"bad config override among {overrides} ({e}){where}") from None
  for key in model_keys:  # Checked against the model the overrides name.
    _check_model_key(config.model.get("name", ""), key)
  return config_lib.with_defaults(config)


def _check_model_key(name: str, key: str) -> None:
  """A new model key must be a keyword argument of the model class: a typo is named, not passed on."""
  from flax import nnx  # Flax: only when a new model key is given.

  from jaxdp import models
  cls = models.resolve(name)
  params = inspect.signature(cls.__init__ if issubclass(cls, nnx.Module) else cls).parameters
  if key not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
    hint = difflib.get_close_matches(key, [p for p in params if p not in ("self", "rngs")], n=1)
    raise config_lib.ConfigError(f"unknown config key 'config.model.{key}': model {name!r} takes no {key!r}"
                                 + (f" (did you mean {hint[0]!r}?)" if hint else ""))


def _bad_override(argv: list[str], error: Exception) -> str:
  """The key ("x.y") of the `--config.x.y` flag that failed with KeyError/AttributeError 'y'."""
  lookup = re.search(r"Attempting to lookup: ([\w.]+)", str(error))  # A key under a field that is no dict.
  key = lookup.group(1).rpartition(".")[2] if lookup else re.search(r"\w+", str(error)).group()
  return next((a.split("=")[0].lstrip("-").removeprefix("config.") for a in argv
               if re.match(rf"--config\.([\w.]+\.)?{key}\b", a)), key)
