"""The objects a caller passes in place of the config's names, and how a workdir records them (tools then name the
argument to pass)."""

import copy
import dataclasses
import inspect
from typing import Any

import ml_collections

# How the stored config names an object passed from Python, which no config can name: "<object __main__.Net>".
OBJECT_PREFIX = "<object "
# Config field -> the keyword that passes its object (train_and_evaluate, tools.evaluate.evaluate, ...).
OBJECT_FIELDS = {"model.name": "model", "task.name": "task", "dataset.name": "eval_data"}


@dataclasses.dataclass(frozen=True)
class Objects:
  """What a Python caller passes in place of the config's names; None: the config's own."""
  model: Any = None       # An NNX module class or instance, or a linen module (models.get_model's `module`).
  task: Any = None        # A task function or object (tasks.get's `task`).
  train_data: Any = None  # A dict of arrays or a random-access source (data.load's).
  eval_data: Any = None
  optimizer: Any = None   # An optax GradientTransformation (optim.make's `optimizer`, or config.optimizer's);
                          # recorded, never asked back.

  def build_kwargs(self) -> dict[str, Any]:
    """The objects given, as keywords (not `dataclasses.asdict`, which would take a linen module apart)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

  def named(self, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of `config` whose names say which objects replaced them, as checkpoints store it."""
    in_config = config.get("optimizer")  # An optax object set in the config itself: recorded as one passed.
    names = {"model.name": self.model, "task.name": self.task,
             "dataset.name": self.eval_data if self.eval_data is not None else self.train_data,
             "optimizer": self.optimizer if self.optimizer is not None or isinstance(in_config, str) else in_config}
    named = copy.deepcopy(config)
    for field, obj in names.items():
      if obj is None:
        continue
      *sections, key = field.split(".")
      node = named
      with named.unlocked():
        for section in sections:
          if section not in node:
            node[section] = ml_collections.ConfigDict()
          node = node[section]
        if key in node:  # Typed as the object it held (config.optimizer): the name replaces it.
          del node[key]
        node[key] = object_name(obj)
    return named


def shown(value: Any) -> str:
  """A config value as a line shows it: a name quoted, an object (or an object's stored name) as `object_name`."""
  if isinstance(value, str):
    return value if value.startswith(OBJECT_PREFIX) else repr(value)
  return object_name(value)


def object_name(obj: Any) -> str:
  """'<object __main__.Net>' for a class or function, '<object __main__.Net instance>' for an instance."""
  if inspect.isclass(obj) or inspect.isfunction(obj):
    return f"{OBJECT_PREFIX}{obj.__module__}.{obj.__qualname__}>"
  return f"{OBJECT_PREFIX}{type(obj).__module__}.{type(obj).__qualname__} instance>"


def passed_objects(config: ml_collections.ConfigDict) -> dict[str, str]:
  """Keyword -> stored name for each of `config`'s names that stands for an object passed from Python (a `__main__`
  class included: another process has none)."""
  found = {}
  for field, keyword in OBJECT_FIELDS.items():
    section, key = field.split(".")
    name = config.get(section, {}).get(key, "") or ""
    if isinstance(name, str) and (name.startswith(OBJECT_PREFIX) or name.startswith("__main__:")):
      found[keyword] = name
  return found
