"""The command line the tools share: flags -> (config, workdir), and the one error path (`guarded`).

`train`, `evaluate`, `sample` and `inspect` take the same `--config CONFIG.py [--config.key=value ...]
[--workdir DIR] [--cpu_devices N]`; this module parses them without importing the training loop. A tool's
own flags (`--step`, `--prompt`, ...) are split from these by `own_flags`; the tools that read a trained
workdir parse with `parse_workdir`, whose config defaults to the one the checkpoint stores.
"""

import argparse
import ast
import difflib
import gc
import inspect
import os
import re
import sys
from collections.abc import Callable
from typing import Any

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

Command = Callable[[ml_collections.ConfigDict, str | None], object]


def parse(argv: list[str], require_workdir: bool = True, *, usage: str = "",
          extra_help: str = "") -> tuple[ml_collections.ConfigDict, str | None]:
  """Command line -> (config, workdir); every mistake is a ConfigError naming the bad value.

  `-h`/`--help`/`--helpfull` print the flags (with `usage` and the caller's `extra_help`) and exit 0.
  Simulated CPU devices (`--cpu_devices N` or JAXDP_CPU_DEVICES) are set up here, before JAX starts.
  """
  start(argv, usage, extra_help)
  if (count := cpu_devices.requested(argv)) is not None:  # First: a config file may already ask JAX for devices.
    cpu_devices.simulate(count)
  new_keys = _new_keys(argv)
  fv = _parse_flags([a for a in argv if _new_key(a) not in new_keys])
  if not fv["config"].present:
    raise config_lib.ConfigError("--config is required (e.g. --config jaxdp/configs/default.py)")
  if require_workdir and not fv.workdir:
    raise config_lib.ConfigError("--workdir is required")
  config = _load(fv)
  _set_new_keys(config, [a for a in argv if _new_key(a) is not None and _new_key(a) in new_keys])
  return config_lib.with_defaults(config), fv.workdir


def start(argv: list[str], usage: str = "", extra_help: str = "") -> None:
  """A command's first step: the flags printed and exit 0 if `argv` asks for help, else the libraries' noise off."""
  # Before the heavy imports (`--help` answers at once) and before JAX loads (`quiet.command`).
  if any(a in HELP_FLAGS for a in argv[1:]):
    print(help_text(usage or f"python -m {_program(argv)} --config CONFIG.py [flags]", extra_help))
    raise SystemExit(0)
  quiet.command()


def help_text(usage: str, extra_help: str = "") -> str:
  """The usage line and every flag, as `--help` prints them."""
  fv = _define(["help"])
  lines = [f"usage: {usage}", "", "flags:"]
  for name in ("config", "workdir", "cpu_devices"):
    lines.append(f"  --{name}: {fv[name].help}")
  return "\n".join(lines + [OVERRIDES_HELP] + ([extra_help] if extra_help else []))


def parse_workdir(argv: list[str], *, usage: str, extra_help: str = "",
                  step: int | None = None) -> tuple[ml_collections.ConfigDict, str]:
  """A trained workdir's command line -> (config, workdir): `--config FILE` as in training, else the config
  checkpoint `step` (default: the newest) stores, with the `--config.key=value` overrides applied."""
  if any(a in HELP_FLAGS for a in argv[1:]) or any(a == "--config" or a.startswith("--config=") for a in argv):
    return parse(argv, require_workdir=True, usage=usage, extra_help=extra_help)
  if (count := cpu_devices.requested(argv)) is not None:  # First, as in `parse`.
    cpu_devices.simulate(count)
  workdir = own_flags(argv, _workdir_flag())[0].workdir
  if not workdir:
    raise config_lib.ConfigError("--workdir is required")
  stored = restore.stored_config(workdir, step)
  argv = _set_unset_fields(stored, argv)
  fv = flags.FlagValues()
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  flags.DEFINE_integer("cpu_devices", None, "", flag_values=fv)
  try:  # The overrides are applied as the flag is defined (`sys_argv`), and again when parsed.
    config_flags.DEFINE_config_dict("config", stored, flag_values=fv, sys_argv=argv)
    fv(argv)
  except flags.Error as e:
    raise config_lib.ConfigError(str(e)) from None
  except (AttributeError, KeyError, TypeError) as e:  # An override names a key the stored config lacks.
    raise config_lib.ConfigError(f"bad config override ({e}) for the config stored in {workdir!r}") from None
  return config_lib.with_defaults(fv.config), workdir


def _set_unset_fields(config: ml_collections.ConfigDict, argv: list[str]) -> list[str]:
  """Sets the `--config.KEY=VALUE` overrides of fields the stored config holds as None with no type (keys the
  default config does not declare, which the flag parser cannot read VALUE for) as `_literal`; returns the rest."""
  rest = []
  for arg in argv:
    path, sep, text = arg.removeprefix("--config.").partition("=")
    *parents, key = path.split(".")
    node = config
    for part in parents:
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if (arg.startswith("--config.") and sep and isinstance(node, ml_collections.ConfigDict) and key in node
        and node.get_type(key) is type(None)):
      with node.unlocked():
        node[key] = _literal(text)
    else:
      rest.append(arg)
  return rest


def workdir_tool(argv: list[str], *, prog: str, usage: str, extra_help: str,
                 flags: Callable[[argparse.ArgumentParser], None],
                 command: Callable[[argparse.Namespace, ml_collections.ConfigDict, str], None]) -> int:
  """A tool on a trained workdir: `--help` answered, logging set up, its own `flags` (with `--step`) split from the
  config's, the workdir's stored config parsed, then `command(its flags, config, workdir)`; returns the exit status."""
  start(argv, usage, extra_help)  # Before the logging setup, which loads JAX.
  process.setup_logging()

  def run() -> None:
    parser = argparse.ArgumentParser(prog=prog, add_help=False)
    parser.add_argument("--step", type=int, default=None)
    flags(parser)
    ours, rest = own_flags(argv, parser)
    config, workdir = parse_workdir(rest, usage=usage, extra_help=extra_help, step=ours.step)
    command(ours, config, workdir)

  return guarded(run)


def own_flags(argv: list[str], parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[str]]:
  """A tool's own flags (those `parser` declares) split from the shared ones: (its values, argv without them).

  A bad value is a ConfigError when `parser` was made with `exit_on_error=False`.
  """
  try:
    ours, rest = parser.parse_known_args(argv[1:])
  except argparse.ArgumentError as e:
    raise config_lib.ConfigError(str(e)) from None
  return ours, argv[:1] + rest


def _workdir_flag() -> argparse.ArgumentParser:
  """`--workdir DIR`, read before the flags are parsed: the stored config it names is their default."""
  parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
  parser.add_argument("--workdir", default=None)
  return parser


def main(argv: list[str], command: Command, *, require_workdir: bool = True,
         failures: tuple[type[Exception], ...] = (), usage: str = "") -> int:
  """Parses `argv`, sets the process up, runs `command(config, workdir)`; returns the exit status.

  A config or command-line mistake is one `error:` line and status 2; an exception in `failures` (or a
  failed distributed start) is one `error:` line and status 1; any other exception is reported (`guarded`).
  """
  start(argv, usage)  # Before the logging setup, which loads JAX.
  process.setup_logging()

  def run() -> None:
    config, workdir = parse(argv, require_workdir, usage=usage)
    process.init(config)
    command(config, workdir)

  return guarded(run, failures)


def guarded(run: Callable[[], int | None], failures: tuple[type[Exception], ...] = ()) -> int:
  """Runs `run`; returns its status (None: 0), every exception reported once and its frames released.

  ConfigError: one `error:` line, status 2. `failures` and a failed distributed start: one line, status 1.
  Anything else, status 1: an input worker's failure as one line (`exits.report`), others with their
  traceback. Released (`exits.release`): an input iterator the error still held is deleted now, while
  Python can still finish its worker calls, and no process hangs on the way out.
  """
  try:
    return run() or 0
  except config_lib.ConfigError as e:
    status, line = 2, str(e)
    error: Exception = e
  except (*_one_line_failures(), *failures) as e:
    status, line = 1, str(e)
    error = e
  except Exception as e:  # Not a mistake we can name: reported, and the process still ends.
    status, line = 1, None
    error = e
  if line is None:
    exits.report(error)
  else:
    print(f"error: {line}", file=sys.stderr)
  exits.release(error)
  del error
  gc.collect()  # Reference cycles through the released frames: collected now, not at interpreter exit.
  return status


def _one_line_failures() -> tuple[type[Exception], ...]:
  """Failures every command reports in one line: a failed distributed start (once jax.distributed is loaded)."""
  distributed = sys.modules.get("jaxdp.runtime.distributed")
  return (distributed.DistributedInitError,) if distributed else ()


def _define(argv: list[str]) -> flags.FlagValues:
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "Path to a config .py file with get_config().",
                                  flag_values=fv, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "Directory for metrics.jsonl and checkpoints.", flag_values=fv)
  flags.DEFINE_integer("cpu_devices", None, f"Simulate this many CPU devices (or {cpu_devices.ENV_VAR}).",
                       flag_values=fv)
  return fv


def _parse_flags(argv: list[str]) -> flags.FlagValues:
  fv = _define(argv)
  try:
    fv(argv)
  except flags.Error as e:
    why = _file_error(e)
    raise (_unloadable(_config_arg(argv), why) if why else config_lib.ConfigError(str(e))) from None
  except (AttributeError, KeyError) as e:  # An override names a key the config does not have.
    bad = _bad_override(argv, e)
    if (key := bad.removeprefix("config.").partition("'")[0]) in config_lib.REMOVED:
      raise config_lib.removed(key) from None
    raise config_lib.ConfigError(f"unknown config key '{bad}") from None
  except TypeError as e:  # An override reaches into a field that is no dict (--config.dataset.name.x=1); the
    # file's own TypeErrors come wrapped in a flags.Error.
    overrides = ", ".join(a.split("=")[0] for a in argv if a.startswith("--config."))
    raise config_lib.ConfigError(f"bad config override among {overrides} ({e})") from None
  except Exception as e:  # The config file itself failed to load, as it is parsed (a syntax error, a bad import...).
    raise _unloadable(_config_arg(argv), e) from None
  return fv


def _file_error(error: flags.Error) -> str | None:
  """The last line of a TypeError or ValueError of the config file's own code, which ml_collections re-raises with
  its traceback in the message ("Error whilst parsing config file"); None for any other flag error."""
  raised = error.__context__
  if not (isinstance(raised, (TypeError, ValueError)) and "Error whilst parsing config file" in str(raised)):
    return None
  return str(raised).strip().splitlines()[-1]


def _unloadable(path: str, why: object) -> config_lib.ConfigError:
  """The one error of a config file that failed to load, whichever step of the parse found it."""
  return config_lib.ConfigError(f"could not load config file {path!r}: {why}")


def _config_arg(argv: list[str]) -> str:
  """The value of `--config FILE` or `--config=FILE` as given (the flag may not have been parsed)."""
  for arg, following in zip(argv, [*argv[1:], ""]):
    if arg.startswith("--config="):
      return arg.removeprefix("--config=")
    if arg == "--config":
      return following
  return ""


def _load(fv: flags.FlagValues) -> ml_collections.ConfigDict:
  """The config with its overrides applied; a missing or broken file is a ConfigError naming it."""
  path = fv["config"].config_filename
  if not os.path.isfile(path):
    raise config_lib.ConfigError(f"config file {path!r} not found")
  try:
    config = fv.config
    if not isinstance(config, ml_collections.ConfigDict):
      if config is not None:  # ml_collections defers an IOError of get_config to the config's first use: here.
        config.keys()
      raise TypeError(f"get_config() returned {config!r}, not a ConfigDict")
  except Exception as e:  # The config file itself failed to load (syntax error, bad import, ...).
    raise _unloadable(path, e.__cause__ or e) from None
  return config


def _new_key(arg: str) -> tuple[str, str] | None:
  """'--config.model.dense=64' -> ('model', 'dense'); '--config.task.gamma=2' -> ('task', 'gamma'); else None."""
  m = re.match(r"--config\.(" + "|".join(NEW_KEY_SECTIONS) + r")\.(\w+)", arg)
  return (m.group(1), m.group(2)) if m else None


def _new_keys(argv: list[str]) -> set[tuple[str, str]]:
  """The `--config.model.KEY` / `--config.task.KEY` overrides whose KEY the config file does not declare
  (new keyword arguments of the model or the task)."""
  keys = {k for a in argv if (k := _new_key(a))}
  if not keys:
    return set()
  declared = _parse_flags([a for a in argv if not _new_key(a)])
  if not declared["config"].present:
    return set()
  config = _load(declared)
  return {(section, key) for section, key in keys if key not in (config.get(section) or {})}


def _set_new_keys(config: ml_collections.ConfigDict, args: list[str]) -> None:
  """Adds `--config.model.KEY=VALUE` (or `--config.task.KEY=VALUE`) for new keys; VALUE is a Python literal,
  or else the plain string. A model key is checked against the model class here; a task key against the
  task's signature when the run builds it (`tasks.get`)."""
  for arg in args:
    section, _ = _new_key(arg)
    prefix = f"--config.{section}."
    path, sep, text = arg[len(prefix):].partition("=")
    if not sep or "." in path:
      raise config_lib.ConfigError(f"unknown config key 'config.{section}.{path}' (new {section} keys take a value: "
                                   f"--config.{section}.{path.split('.')[0]}=VALUE)")
    value = _literal(text)
    if section == "model":
      _check_model_key(config.model.get("name", ""), path)
    if section not in config:
      with config.unlocked():
        config[section] = ml_collections.ConfigDict()
    with config[section].unlocked():
      config[section][path] = value


def _literal(text: str) -> Any:
  """An override's VALUE where no declared type says how to read it: a Python literal, else the plain string."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


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
  """The `--config.x.y` flag that failed with KeyError/AttributeError 'y', with ml_collections' hint."""
  key = re.search(r"\w+", str(error)).group()
  hint = re.search(r'Did you mean "(\w+)"', str(error))
  flag = next((a.split("=")[0].lstrip("-") for a in argv if re.match(rf"--config\.([\w.]+\.)?{key}\b", a)), key)
  return f"{flag}'" + (f" (did you mean {hint.group(1)!r}?)" if hint else "")


def _program(argv: list[str]) -> str:
  """'jaxdp.train' for argv[0] '.../jaxdp/train.py' (or 'jaxdp.train')."""
  base = os.path.basename(argv[0]) if argv else "train"
  if base.startswith("jaxdp."):  # A module name already (splitext would take ".train" for an extension).
    return base.removesuffix(".py")
  return f"jaxdp.{os.path.splitext(base)[0]}"

