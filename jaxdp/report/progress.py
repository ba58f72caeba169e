"""What a run shows while it trains (process 0): a tqdm bar on a terminal, plain periodic lines otherwise."""

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

import jax
import tqdm
from tqdm.contrib import logging as tqdm_logging

from jaxdp.report import units
from jaxdp.report import flops as flops_lib

REDRAW_SECONDS = 0.1  # tqdm's `mininterval`: a bar redrawn every step would cost more than a tiny step.
DEFAULT_HEADLINE = ("accuracy",)  # Classification's, the default task's.
# Metrics shown under a short label as a percentage (`acc 87.5%`); any other is `name 0.1234`.
PERCENT_LABELS = {"accuracy": "acc"}


class Reporter:
  """Times the steps between sync points (less `untimed_seconds()`: eval, checkpoints) and prints progress."""

  def __init__(self, total_steps: int, start_step: int, global_batch: int, num_devices: int, *,
               flops_per_step: float | None = None, peak_flops: float | None = None,
               stream: TextIO | None = None, interactive: bool | None = None, enabled: bool | None = None,
               clock: Callable[[], float] = time.perf_counter, redraw_seconds: float = REDRAW_SECONDS,
               untimed_seconds: Callable[[], float] = lambda: 0.0,
               headline: tuple[str, ...] = DEFAULT_HEADLINE):
    self.total_steps = total_steps
    self.start_step = start_step
    self.global_batch = global_batch
    self.num_devices = num_devices
    self.headline = tuple(headline)
    self.flops_per_step = flops_per_step
    self.peak_flops = peak_flops
    self.stream = stream if stream is not None else sys.stdout
    self.interactive = is_terminal(self.stream) if interactive is None else interactive
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._clock = clock
    self._untimed = untimed_seconds
    # (step, time, untimed seconds) where the current timing began.
    self._window: tuple[int, float, float] | None = None
    self._timed_steps = 0
    self._timed_seconds = 0.0
    self._loss: float | None = None
    self._redraw_seconds = redraw_seconds
    self._step = start_step  # The last step dispatched.
    self._bar: _Bar | None = None  # Opened at the first step on a terminal, closed by `close`.
    self._bar_context = contextlib.ExitStack()  # Log records go through tqdm while the bar is open.

  def on_step(self, step: int) -> None:
    """Called after step `step` was dispatched; redraws the bar on a terminal."""
    now = self._clock()
    if self._window is None:  # The first step's dispatch (and any compile) is not timed.
      self._window = (step, now, self._untimed())
    self._step = step
    if self.enabled and self.interactive:
      bar = self._bar or self._open_bar()
      bar.update(step - bar.n)  # tqdm redraws at most every `mininterval`.

  def on_log(self, step: int, scalars: Mapping[str, float]) -> dict[str, float]:
    """Once every step up to `step` is on the host: prints the train line; returns the `perf/...` scalars."""
    perf = self._close_window(step)
    self._loss = scalars.get("train/loss", self._loss)
    head = f"{_step_of(step, self.total_steps)} {100 * step / self.total_steps:3.0f}%"
    eta = self.eta_seconds(step)
    self.note(" | ".join([head, *figures(scalars, perf, eta, per_device=True, headline=self.headline)]))
    return perf

  def on_eval(self, step: int, scalars: Mapping[str, float]) -> None:
    """Prints the eval line; the next timing window starts now, after the eval."""
    self.note(eval_line(step, self.total_steps, scalars, self.headline))
    self._window = (step, self._clock(), self._untimed())

  def close(self) -> None:
    """Ends the display: clears a bar left on the terminal (also when the run stops early)."""
    if self._bar is not None:
      self._bar.close()  # leave=False: the bar's line is blanked, the cursor back at its start.
      self._bar = None
      self._bar_context.close()

  def done(self) -> None:
    """Prints the average throughput of the timed steps (at the end of a run that finished)."""
    if self._timed_steps:
      step_time = self._timed_seconds / self._timed_steps
      self.note(f"done | {self.global_batch / step_time:,.0f} ex/s on average | {1000 * step_time:.1f} ms/step "
                  f"over {self._timed_steps} timed steps ({units.duration(self._timed_seconds)})")

  def eta_seconds(self, step: int) -> float | None:
    """Seconds left for the remaining steps at the average step time so far (None before any timing)."""
    return (self.total_steps - step) * self._timed_seconds / self._timed_steps if self._timed_steps else None

  def _close_window(self, step: int) -> dict[str, float]:
    """Throughput of the steps since the window began; starts the next window."""
    now, untimed = self._clock(), self._untimed()
    window, self._window = self._window, (step, now, untimed)
    if window is None or step <= window[0]:
      return {}
    steps, seconds = step - window[0], _timed_since(window, now, untimed)
    self._timed_steps += steps
    self._timed_seconds += seconds
    return self._perf(seconds / steps)

  def _perf(self, step_seconds: float) -> dict[str, float]:
    """Step time, examples per second (total and per device) and, when the peak is known, MFU."""
    perf = {"perf/step_time": step_seconds, "perf/examples_per_second": self.global_batch / step_seconds,
            "perf/examples_per_second_per_device": self.global_batch / step_seconds / self.num_devices}
    if (mfu := flops_lib.mfu(self.flops_per_step, step_seconds, self.peak_flops)) is not None:
      perf["perf/mfu"] = mfu
    return perf

  def _open_bar(self) -> "_Bar":
    """The terminal's bar: jaxdp's figures in its description, not tqdm's own rate and remaining time."""
    width = len(str(self.total_steps))
    self._bar = _Bar(self._figures, total=self.total_steps, initial=self.start_step, file=self.stream, leave=False,
                     mininterval=self._redraw_seconds, dynamic_ncols=True,  # A wrapped line breaks the redraw.
                     bar_format=f"step {{n:>{width}}}/{{total}} {{percentage:3.0f}}% |{{bar}}| {{desc}}")
    self._bar_context.enter_context(_console_logs_through_tqdm())
    return self._bar

  def _figures(self) -> str:
    """`loss 0.4123 | 5,234 ex/s | 24.5 ms/step | MFU 31.0% | ETA 0:00:07`, from the timing so far."""
    step, window = self._step, self._window
    average = self._timed_seconds / self._timed_steps if self._timed_steps else None
    live = average  # Just after a sync point; else the current window's step time (dispatch-timed: close enough,
    if window is not None and step > window[0]:  # as the steps in flight are bounded).
      live = _timed_since(window, self._clock(), self._untimed()) / (step - window[0]) or average
    perf = self._perf(live) if live else {}
    eta = (self.total_steps - step) * (average or live) if live else None
    return " | ".join(figures({} if self._loss is None else {"train/loss": self._loss}, perf, eta, per_device=False))

  def note(self, line: str) -> None:
    """Prints a line (a train or eval line, or e.g. where the run's time went) on process 0, above a bar."""
    if not self.enabled:
      return
    if self._bar is not None:
      self._bar.write(line, file=self.stream)  # Clears the bar, prints the line, redraws the bar below it.
    else:
      self.stream.write(line + "\n")
    self.stream.flush()


class _Bar(tqdm.tqdm):
  """A tqdm bar whose text is computed only when it is drawn (docs/design-notes.md#loop-host-costs)."""

  def __init__(self, describe: Callable[[], str], **kwargs):
    self._describe = describe  # Set first: tqdm draws once in __init__.
    super().__init__(**kwargs)

  @property
  def format_dict(self) -> dict:
    """tqdm's fields for drawing, with the description from `describe`."""
    return {**super().format_dict, "prefix": self._describe()}


def _timed_since(window: tuple[int, float, float], now: float, untimed: float) -> float:
  """Seconds since `window` (step, time, untimed seconds) began, less the untimed work done meanwhile."""
  return now - window[1] - (untimed - window[2])


def _step_of(step: int, total: int) -> str:
  """`step  50/400`: the head of every line, the step right-aligned to the total's width."""
  return f"step {step:>{len(str(total))}}/{total}"


def metric_figures(scalars: Mapping[str, float], prefix: str, headline: tuple[str, ...]) -> list[str]:
  """`loss 0.4123`, then each headline metric that is there: `acc 87.5%` or `mse 0.1234` (4 significant digits)."""
  parts = [f"loss {scalars[f'{prefix}/loss']:.4f}"] if f"{prefix}/loss" in scalars else []
  for name in headline:
    if name == "loss" or (key := f"{prefix}/{name}") not in scalars:  # The loss is always first, once.
      continue
    label = PERCENT_LABELS.get(name)
    parts.append(f"{label} {100 * scalars[key]:.1f}%" if label else f"{name} {scalars[key]:.4g}")
  return parts


def figures(scalars: Mapping[str, float], perf: Mapping[str, float], eta: float | None,
            per_device: bool, headline: tuple[str, ...] = DEFAULT_HEADLINE) -> list[str]:
  """The train figures that are there, in the order of the log line and the bar: loss, headline ... ETA."""
  parts = metric_figures(scalars, "train", headline)
  if scalars.get("train/nonfinite"):
    parts.append(f"{int(scalars['train/nonfinite'])} non-finite steps skipped")
  if "perf/examples_per_second" in perf:
    device = f" ({perf['perf/examples_per_second_per_device']:,.0f}/device)" if per_device else ""
    parts.append(f"{perf['perf/examples_per_second']:,.0f} ex/s{device}")
    parts.append(f"{1000 * perf['perf/step_time']:.1f} ms/step")
  if "perf/mfu" in perf:
    parts.append(f"MFU {100 * perf['perf/mfu']:.1f}%")
  if eta is not None:
    parts.append(f"ETA {units.duration(eta)}")
  return parts


def eval_line(step: int, total: int, scalars: Mapping[str, float],
              headline: tuple[str, ...] = DEFAULT_HEADLINE) -> str:
  """`step 200/400 eval | loss 0.1234 | acc 97.2% | 360 examples`."""
  parts = [f"{_step_of(step, total)} eval", *metric_figures(scalars, "eval", headline)]
  if "eval/num_examples" in scalars:
    parts.append(f"{int(scalars['eval/num_examples']):,} examples")
  return " | ".join(parts)


def _console_logs_through_tqdm() -> contextlib.AbstractContextManager:
  """Console log records through `tqdm.write`, not breaking the bar; only for a console handler (else tqdm adds one)."""
  consoles = (sys.stdout, sys.stderr)
  if any(isinstance(h, logging.StreamHandler) and h.stream in consoles for h in logging.root.handlers):
    return tqdm_logging.logging_redirect_tqdm()
  return contextlib.nullcontext()


def is_terminal(stream: object) -> bool:
  """Whether `stream` is an open terminal (a bar can be redrawn there)."""
  try:
    return stream.isatty()
  except (AttributeError, ValueError):  # No isatty, or a closed stream.
    return False
