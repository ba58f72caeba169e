"""Where a workdir's wall time goes (goodput), per category, summed over its runs in WORKDIR/goodput.json."""

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator

import jax
from jax import monitoring

from jaxdp.report import units

FILE = "goodput.json"
# In print order; "train" is the steps themselves (dispatch and waiting for the device).
CATEGORIES = ("train", "compile", "input", "eval", "checkpoint", "restore", "setup", "restart")
LABELS = {"train": "training", "compile": "compilation", "input": "input", "eval": "eval",
          "checkpoint": "checkpoint saves", "restore": "restore", "setup": "setup", "restart": "restarts"}
# Set by jaxdp.launch on the processes it restarts after a failure: the time since the failed run's last saved
# totals (its lost work, the stop, the new start) counts as `restart`.
ENV_RESTARTED = "JAXDP_RESTARTED"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # XLA compile or persistent-cache read.
# Making a program: tracing (nested for a jit called inside a traced function), lowering, XLA compile.
_MAKING_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  _COMPILE_EVENT)
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass
class Span:
  """The wall seconds one timed block took, compilation inside it included (filled in when it ends)."""
  seconds: float = 0.0


class CompileWatch:
  """What JAX spends making programs (heard through `jax.monitoring`): XLA compile time, cache hits, and `busy`."""

  def __init__(self):
    self.seconds = 0.0  # XLA compilation (or a persistent-cache read) alone, as the start summary reports it.
    self.programs = 0
    self.cache_hits = 0
    self.busy = 0.0  # Wall time of tracing, lowering and compiling together, each moment counted once.
    self._spans: list[tuple[float, float]] = []  # Disjoint (start, end) times already in `busy`.

  def __enter__(self) -> "CompileWatch":
    monitoring.register_event_duration_secs_listener(self._on_duration)
    monitoring.register_event_time_span_listener(self._on_span)
    monitoring.register_event_listener(self._on_event)
    return self

  def __exit__(self, *exc: object) -> None:
    monitoring.unregister_event_duration_listener(self._on_duration)
    monitoring.unregister_event_time_span_listener(self._on_span)
    monitoring.unregister_event_listener(self._on_event)

  def _on_span(self, event: str, start: float, end: float, **kwargs: object) -> None:
    """Adds the part of [start, end] not yet counted: an inner jit's trace lies inside its caller's."""
    if event not in _MAKING_EVENTS:
      return
    touching = [(s, e) for s, e in self._spans if s <= end and e >= start]
    self.busy += end - start - sum(min(e, end) - max(s, start) for s, e in touching)
    joined = (min([start, *(s for s, _ in touching)]), max([end, *(e for _, e in touching)]))
    self._spans = [span for span in self._spans if span not in touching] + [joined]

  def _on_duration(self, event: str, seconds: float, **kwargs: object) -> None:
    if event == _COMPILE_EVENT:
      self.seconds += seconds
      self.programs += 1

  def _on_event(self, event: str, **kwargs: object) -> None:
    if event == _CACHE_HIT_EVENT:
      self.cache_hits += 1

  def describe(self) -> str:
    """`2.31 s for 3 programs (2 from the persistent cache)`."""
    cache = jax.config.jax_compilation_cache_dir and jax.config.jax_enable_compilation_cache
    source = f"{self.cache_hits} from the persistent cache" if cache else "no persistent cache"
    return f"{self.seconds:.2f} s for {self.programs} program{'s' * (self.programs != 1)} ({source})"


class Clock:
  """Wall time per category for this run, plus the totals of the workdir's earlier runs."""

  def __init__(self, workdir: str, compiles: CompileWatch, clock: Callable[[], float] = time.perf_counter,
               now: Callable[[], float] = time.time):
    self.path = os.path.join(workdir, FILE)
    self.compiles = compiles
    self._clock, self._now = clock, now
    self.began = clock()
    self.seconds = dict.fromkeys(CATEGORIES, 0.0)
    self._between_steps = 0.0  # Wall seconds of this run's eval and checkpoint spans, compilation included.
    self._window = (0.0, 0.0)  # This run's (train, input) seconds at the last `input_wait`.
    self.previous, self.runs, saved_at = _load(self.path)
    if os.environ.get(ENV_RESTARTED) and saved_at is not None:  # Lost: on no clock since the last save.
      self.seconds["restart"] = max(0.0, now() - saved_at)

  @contextlib.contextmanager
  def span(self, category: str) -> Iterator[Span]:
    """Counts the time inside as `category`, JAX making programs inside it as `compile`; yields its whole Span."""
    span, began, compiled = Span(), self._clock(), self.compiles.busy
    try:
      yield span
    finally:
      span.seconds = self._clock() - began
      compile_seconds = self.compiles.busy - compiled
      self.seconds["compile"] += compile_seconds
      self.seconds[category] += span.seconds - compile_seconds
      if category in ("eval", "checkpoint"):  # Not training: the progress line's step time leaves it out.
        self._between_steps += span.seconds

  def add(self, category: str, seconds: float) -> None:
    """Counts `seconds` that its owner timed as `category` (the loop's waits for input, as the feed timed them)."""
    self.seconds[category] += seconds

  def input_wait(self) -> float:
    """`perf/input_wait`: the share of the loop's step time (train and input) since the last call spent waiting for
    input; near 1: input limits the step (docs/data.md#input-speed)."""
    window, self._window = self._window, (self.seconds["train"], self.seconds["input"])
    steps, waited = self._window[0] - window[0], self._window[1] - window[1]
    return waited / (steps + waited) if steps + waited > 0 else 0.0

  def between_steps(self) -> float:
    """Wall seconds this run spent so far in eval and checkpoint saves (their compilation included)."""
    return self._between_steps

  def totals(self) -> dict[str, float]:
    """Seconds per category and `wall`, summed over this workdir's runs (this one up to now)."""
    now = {**self.seconds, "wall": self._clock() - self.began + self.seconds["restart"]}
    return {k: self.previous.get(k, 0.0) + v for k, v in now.items()}

  def scalars(self) -> dict[str, float]:
    """`time/total/<category>` and `time/total/wall` in seconds, and `time/goodput` (training's share)."""
    totals = self.totals()
    out = {f"time/total/{k}": v for k, v in totals.items()}
    out["time/goodput"] = totals["train"] / max(totals["wall"], 1e-9)
    return out

  def line(self) -> str:
    """`time | 0:01:02 wall over 2 runs: 81% training, 9% compilation, ...` (categories that took any time)."""
    totals = self.totals()
    wall = max(totals["wall"], 1e-9)
    shares = [f"{100 * totals[k] / wall:.0f}% {LABELS[k]}" for k in CATEGORIES if totals[k] >= 0.0005 * wall]
    runs = self.runs + 1
    return f"time | {units.duration(totals['wall'])} wall over {runs} run{'s' * (runs != 1)}: " + ", ".join(shares)

  def save(self) -> None:
    """Writes the totals so far (process 0; replaced atomically, so a kill leaves the previous file)."""
    if jax.process_index() != 0:
      return
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      json.dump({"runs": self.runs + 1, "seconds": self.totals(), "saved_at": self._now()}, f)
    os.replace(tmp, self.path)


def _load(path: str) -> tuple[dict[str, float], int, float | None]:
  """(seconds per category, runs, when saved) of the earlier runs; nothing for a new or unreadable file."""
  try:
    with open(path) as f:
      saved = json.load(f)
    seconds = {k: float(v) for k, v in saved["seconds"].items()}
    return seconds, int(saved["runs"]), float(saved["saved_at"]) if "saved_at" in saved else None
  except (OSError, ValueError, KeyError, TypeError):
    return {}, 0, None
