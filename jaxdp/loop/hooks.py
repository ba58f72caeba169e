"""Hooks: user code the loop calls at log, eval, checkpoint and every N steps, alike everywhere (docs/hooks.md)."""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxdp.config import ConfigError
from jaxdp.report.metrics import is_number
from jaxdp.report.hook import Hook, StepInfo

EVENTS = ("on_log", "on_eval", "on_checkpoint", "on_step")  # The calls whose STOP is honoured.


class _Stop:
  """The one value a hook returns to ask the run to stop."""

  def __repr__(self) -> str:
    return "jaxdp.STOP"


STOP = _Stop()


class HookError(ConfigError):
  """A hook raised: the CLI reports it in one `error:` line naming the hook (the original error is its cause)."""


class _FunctionHook(Hook):
  """`fn(info)` called on one event."""

  def __init__(self, fn: Callable[[StepInfo], Any], every: int, on: str):
    self.fn, self.every, self.__name__ = fn, every, getattr(fn, "__name__", repr(fn))
    setattr(self, on, fn)  # An instance attribute: the loop sees this event overridden, and only it.


def hook(fn: Callable[[StepInfo], Any], *, every: int = 0, on: str = "step") -> Hook:
  """A hook calling `fn(info)` every `every` steps, or after each `on` ("log", "eval", "checkpoint")."""
  event = f"on_{on}"
  if event not in EVENTS:
    raise ConfigError(f"hook on={on!r}: choose from step, log, eval, checkpoint")
  if (event == "on_step") != (every > 0):
    raise ConfigError(f"hook {fn!r}: every={every} goes with on='step' (and only with it), every > 0")
  return _FunctionHook(fn, every, event)


class EarlyStopping(Hook):
  """Stops the run when eval `metric` has not improved by more than `min_delta` for `patience` evals."""

  def __init__(self, metric: str = "eval/loss", mode: str = "min", patience: int = 3, min_delta: float = 0.0):
    if mode not in ("min", "max"):
      raise ConfigError(f"EarlyStopping mode={mode!r}: choose min or max")
    self.metric, self.sign, self.patience, self.min_delta = metric, 1.0 if mode == "min" else -1.0, patience, min_delta
    self.best, self.waited = math.inf, 0  # In `sign` units: lower is better.

  def on_eval(self, info: StepInfo) -> Any:
    if self.metric not in info.metrics:
      raise ConfigError(f"no eval metric {self.metric!r} (the run has {', '.join(sorted(info.metrics))})")
    value = self.sign * float(info.metrics[self.metric])
    if value < self.best - self.min_delta:  # NaN never improves.
      self.best, self.waited = value, 0
      return None
    self.waited += 1
    return STOP if self.waited >= self.patience else None


def name(h: Hook) -> str:
  """How errors and status lines name a hook: its function's or its class's name."""
  return getattr(h, "__name__", None) or type(h).__name__


def _overrides(h: Hook, event: str) -> bool:
  return getattr(getattr(h, event), "__func__", None) is not getattr(Hook, event)


def check(hooks: Sequence[Hook]) -> list[Hook]:
  """`hooks` as a list; anything not a Hook is a ConfigError naming it."""
  for h in hooks:
    if not isinstance(h, Hook):
      raise ConfigError(f"hooks: {h!r} is not a jaxdp.Hook (make one of a function with jaxdp.hook(fn, every=N))")
  return list(hooks)


class Hooks:
  """The run's hooks (the default trackers first), called in order; agrees on a stop across processes."""

  def __init__(self, hooks: Sequence[Hook], workdir: str, host: Callable[[Any], Any] = lambda tree: tree):
    self.hooks, self.workdir, self.host = list(hooks), workdir, host
    self.ran = False  # Whether a hook's event ran since the last agreement (the same steps on every process).
    self.stopped_by: str | None = None  # The hook that asked to stop (on this process).

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Every tracker's `on_write` with one record: its numbers, and its identifiers (`data/digest`) too where the
    tracker keeps them (metrics.jsonl)."""
    numbers = {k: v for k, v in scalars.items() if is_number(v)}
    for h in self.hooks:
      _call(h, "on_write", step, h.on_write, step, scalars if getattr(h, "keeps_identifiers", False) else numbers)

  def call(self, event: str, step: int, state: Any, metrics: Mapping[str, float] | None = None) -> None:
    """`event` of every hook overriding it; a STOP is remembered for `should_stop`."""
    due = [h for h in self.hooks
           if _overrides(h, event) and (event != "on_step" or (h.every > 0 and step % h.every == 0))]
    if not due:  # Most steps: no StepInfo is made on the loop's path.
      return
    info = StepInfo(step, dict(metrics or {}), state, self.workdir, self.host)
    for h in due:
      self.ran = self.ran or event in EVENTS
      if _call(h, event, step, getattr(h, event), info) is STOP and event in EVENTS and self.stopped_by is None:
        self.stopped_by = name(h)

  def should_stop(self, step: int, state: Any) -> bool:
    """After step `step`: `on_step`, then whether any hook on any process asked to stop (collective)."""
    self.call("on_step", step, state)
    if not self.ran:
      return False
    self.ran = False
    return any_process(self.stopped_by is not None)

  def close(self) -> None:
    """Closes every hook, then raises the first failure."""
    failures = []
    for h in self.hooks:
      try:
        _call(h, "close", -1, h.close)
      except HookError as e:
        failures.append(e)
    if failures:
      raise failures[0]


def _call(h: Hook, event: str, step: int, fn: Callable, *args: Any) -> Any:
  """`fn(*args)`; an exception becomes one HookError naming the hook."""
  try:
    return fn(*args)
  except Exception as e:
    where = f" at step {step}" if step >= 0 else ""
    first = (str(e).splitlines() or [""])[0]
    raise HookError(f"hook {name(h)} failed in {event}{where}: {type(e).__name__}: {first}") from e


def any_process(flag: bool) -> bool:
  """Whether `flag` is set on any process (an all-gather with several; every process calls it at once)."""
  import jax
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils
  return bool(np.any(multihost_utils.process_allgather(np.array([flag], np.int32))))
