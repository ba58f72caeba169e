"""Preemption's watcher (`jaxdp.loop.preemption`): a stop signal is recorded once, a second acts as it would without
jaxdp, the handlers are put back, and every process stops at the same step. The end to end stops (SIGTERM to a
process, to the launcher) are in test_checkpoint and test_multiprocess."""

import os
import signal
import time

import numpy as np
import pytest

from jaxdp.loop import preemption


def _signal_self(signum: int) -> None:
  """Sends `signum` to this process and gives Python the moment to run its handler."""
  os.kill(os.getpid(), signum)
  time.sleep(0.05)


@pytest.mark.parametrize("signum", preemption.SIGNALS)
def test_a_first_signal_is_recorded_and_a_second_acts_as_without_jaxdp(signum):
  """A user who presses Ctrl-C twice (or a scheduler that insists) is not ignored: the second is theirs."""
  seen = []
  before = signal.signal(signum, lambda s, frame: seen.append(s))  # Stands for "as without jaxdp".
  try:
    with preemption.Watcher() as watcher:
      assert not watcher.should_stop(1)
      _signal_self(signum)
      assert watcher.should_stop(2) and seen == []
      _signal_self(signum)
      assert seen == [signum]
  finally:
    signal.signal(signum, before)


def test_the_handlers_are_put_back_when_the_watch_ends():
  before = {s: signal.getsignal(s) for s in preemption.SIGNALS}
  with preemption.Watcher():
    assert all(signal.getsignal(s) != before[s] for s in preemption.SIGNALS)
  assert {s: signal.getsignal(s) for s in preemption.SIGNALS} == before


def test_without_the_service_a_signal_to_any_process_stops_every_one(monkeypatch):
  """Each process all-gathers the flags at a sync step: one process signalled is enough for all to stop."""
  monkeypatch.setattr(preemption.jax, "process_count", lambda: 2)
  monkeypatch.setattr(preemption.multihost_utils, "process_allgather", lambda flag: np.stack([flag, ~flag]))
  before = preemption.jax.config.jax_enable_preemption_service
  try:
    preemption.jax.config.update("jax_enable_preemption_service", False)
    watcher = preemption.Watcher()
    assert watcher.should_stop(1)  # This process was not signalled; the other was.
  finally:
    preemption.jax.config.update("jax_enable_preemption_service", before)


def test_the_processes_agree_every_step_with_or_without_the_preemption_service(monkeypatch):
  calls = []
  monkeypatch.setattr(preemption.jax, "process_count", lambda: 2)
  monkeypatch.setattr(preemption.multihost_utils, "reached_preemption_sync_point",
                      lambda step: calls.append(("service", step)) or False)
  monkeypatch.setattr(preemption.multihost_utils, "process_allgather", lambda flags: calls.append(("gather",)) or flags)
  before = preemption.jax.config.jax_enable_preemption_service
  try:
    for service in (True, False):
      preemption.jax.config.update("jax_enable_preemption_service", service)
      watcher = preemption.Watcher()
      assert not any(watcher.should_stop(step) for step in range(1, 7))
  finally:
    preemption.jax.config.update("jax_enable_preemption_service", before)
  assert calls == [("service", s) for s in range(1, 7)] + [("gather",)] * 6
