"""Tasks, `task(model, batch) -> (loss, metrics)`: built-in or a user's, by name or object; `config.task.*`: its kwargs."""

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import ml_collections
import numpy as np

from jaxdp import config as config_lib
from jaxdp import objects
from jaxdp.config import ConfigError
from jaxdp.tasks.base import KINDS, BoundModel, Metric, Task
from jaxdp.tasks.classification import Classification
from jaxdp.tasks.next_token import NextToken
from jaxdp.tasks.regression import Regression

__all__ = ["BUILTIN", "KINDS", "BoundModel", "Classification", "Metric", "NextToken", "Regression", "Resolved", "Task",
           "get", "headline", "resolve"]

BUILTIN: dict[str, type] = {"classification": Classification, "next_token": NextToken, "regression": Regression}


@dataclasses.dataclass(frozen=True)
class Resolved:
  """The run's task and how it was chosen, for the start summary."""
  task: Task
  name: str    # "classification", "my_tasks:focal", "<object focal>".
  origin: str  # Why: "inferred from integer labels", "config.task.name", "passed from Python".

  def describe(self) -> str:
    """"classification (inferred from integer labels)"."""
    return f"{self.name} ({self.origin})"


Targets = Callable[[], np.ndarray]  # Some targets of the data, read when a task needs them (`Regression.center`).


def get(config: ml_collections.ConfigDict, facts: Any, task: Any = None, targets: Targets | None = None) -> Task:
  """The run's task: `task` (an object from Python) if given, else `config.task.name`, else inferred from `facts`."""
  return resolve(config, facts, task, targets).task


def resolve(config: ml_collections.ConfigDict, facts: Any, task: Any = None, targets: Targets | None = None) -> Resolved:
  """`get`, with the task's name and why it runs; ConfigError (one line) for an unknown name or field."""
  kwargs = {k: v for k, v in config.task.to_dict().items() if k != "name"}
  if task is not None:  # Its fields are bound and checked as a named task's are.
    if not callable(task):
      raise ConfigError(f"task {task!r} is not callable: pass a function task(model, batch) or a task object")
    target, name, origin = task, objects.object_name(task), "passed from Python"
  else:
    name, origin = config.task.name, "config.task.name"
    if not name:
      name = "regression" if getattr(facts, "float_labels", False) else "classification"
      origin = f"inferred from {'float' if name == 'regression' else 'integer'} labels"
    target = BUILTIN.get(name) or _import(name)
  built = _bind(target, kwargs, name)
  if isinstance(built, Regression) and built.center is None and targets is not None:
    built = built.centered(targets())
  return Resolved(built, name, origin)


def headline(task: Any) -> tuple[str, ...]:
  """The metrics the progress line shows: the task's `headline`, else none besides the loss."""
  return tuple(getattr(task, "headline", ()))


def _import(name: str) -> Any:
  """The callable a "package.module:function_or_Class" task name names."""
  if ":" not in name:
    raise ConfigError(f"unknown task {name!r} (built-in: {', '.join(BUILTIN)}; or 'package.module:function_or_Class')")
  target = config_lib.import_named(name, "task")
  if not callable(target):
    raise ConfigError(f"task {name!r} is not a function or class")
  return target


def _bind(target: Any, kwargs: dict, name: str) -> Task:
  """A task class built with the config's `task.*` fields, or a task function with them bound (after model, batch)."""
  is_class = inspect.isclass(target)
  if not (kwargs or is_class):
    return target
  parameters = list(inspect.signature(target).parameters.values())[0 if is_class else 2:]
  unknown = sorted(set(kwargs) - {p.name for p in parameters})
  if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
    accepted = ", ".join(p.name for p in parameters) or "none"
    raise ConfigError(f"task {name!r} takes no field {', '.join('config.task.' + k for k in unknown)} "
                      f"(its keyword arguments: {accepted})")
  return target(**kwargs) if is_class else functools.update_wrapper(functools.partial(target, **kwargs), target)
