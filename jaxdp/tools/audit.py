"""`python -m jaxdp.audit WORKDIR [OTHER]`: checks the data order that `config.audit_data=True` recorded.

One workdir: its lineage (a resume keeps the steps up to the checkpoint it restored) must be steps 1, 2, 3, ... with
whole global batches, each completed epoch holds an example at most once, and each batch is the one its order
(`jaxdp.data.order`) names. Two workdirs: the first step whose global batches differ is named. The recorder is
`jaxdp.loop.audit`.
"""

import dataclasses
import glob
import itertools
import json
import os
import pathlib
import sys
from typing import Any

import numpy as np

from jaxdp.config import ConfigError
from jaxdp.loop.audit import AUDIT_DIR, IDS_DTYPE, saves_path, stem
from jaxdp.tools import cli

USAGE = "usage: python -m jaxdp.audit WORKDIR [OTHER_WORKDIR]"
STREAM_KEYS = ("global_batch", "num_examples", "seed", "split", "dataset")  # The header facts no resume may change.


class AuditError(Exception):
  """The audit failed: the message names the first step (and example) where it did."""


@dataclasses.dataclass
class Segment:
  """One run of the loop: its header (from process 0) and its whole global batches, step -> ids."""
  header: dict[str, Any]
  steps: dict[int, np.ndarray]
  saves: list[int]
  problem: str | None = None  # A gap in what the processes recorded.

  @property
  def name(self) -> str:
    h = self.header
    return f"segment {h['segment']} ({h['process_count']} process(es) x {h['num_devices']} devices)"


@dataclasses.dataclass
class Entry:
  """One step of the lineage: which step it was, in which segment, its global batch."""
  step: int
  segment: Segment
  ids: np.ndarray


def load(workdir: str) -> list[Segment]:
  """The recorded segments of a workdir, oldest first."""
  directory = os.path.join(workdir, AUDIT_DIR)
  headers = glob.glob(os.path.join(directory, "*.p*.json"))
  if not headers:
    # A command-line mistake (the wrong workdir, or none audited): status 2.
    raise ConfigError(f"no audit records in {directory!r} (train with --config.audit_data=True)")
  records = sorted((json.loads(pathlib.Path(p).read_text()) for p in headers),
                   key=lambda h: (h["segment"], h["process_index"]))
  return [_segment(directory, list(hs)) for _, hs in itertools.groupby(records, key=lambda h: h["segment"])]


def _segment(directory: str, headers: list[dict]) -> Segment:
  """Assembles the global batches of one segment from its processes' records."""
  head = headers[0]
  saves = pathlib.Path(saves_path(directory, head["segment"]))
  seg = Segment(head, {}, [int(s) for s in saves.read_text().split()] if saves.exists() else [])
  found = [h["process_index"] for h in headers]
  if found != list(range(head["process_count"])):
    seg.problem = f"the records of processes {sorted(set(range(head['process_count'])) - set(found))} are missing"
    return seg
  per_process = [_read_ids(directory, h) for h in headers]
  last = min((max(p) if p else head["start_step"]) for p in per_process)  # A killed run: the steps all recorded.
  for step in range(head["start_step"] + 1, last + 1):
    parts = [p.get(step) for p in per_process]
    if any(x is None for x in parts):
      missing = [h["process_index"] for h, x in zip(headers, parts) if x is None]
      seg.problem = f"step {step} was not recorded by process(es) {missing}"
      break
    seg.steps[step] = np.concatenate(parts)
  return seg


def _read_ids(directory: str, header: dict) -> dict[int, np.ndarray]:
  """step -> this process's ids, from its .ids file (a torn last record is dropped)."""
  width = 1 + header["rows"][1] - header["rows"][0]
  raw = np.fromfile(stem(directory, header["segment"], header["process_index"]) + ".ids", IDS_DTYPE)
  records = raw[:len(raw) // width * width].reshape(-1, width)
  return {int(r[0]): r[1:] for r in records}


def lineage(segments: list[Segment]) -> list[Entry]:
  """The steps the final state trained on, in order: each resume keeps what its checkpoint held, then continues."""
  entries: list[Entry] = []
  saved_at: dict[int, int] = {}  # checkpointed step -> length of the lineage it held (the latest save of it).
  for seg in segments:
    h = seg.header
    restored = h["restored_from"]
    if restored is None:
      entries = []  # A fresh start (no checkpoint): nothing before it is in this state.
    elif restored in saved_at:
      entries = entries[:saved_at[restored]]
    elif entries or saved_at:
      raise AuditError(f"{seg.name} resumed from checkpoint {restored}, which no audited segment saved: the steps "
                       f"before it cannot be checked")
    else:
      raise AuditError(f"{seg.name} resumed from checkpoint {restored}, saved before the audit was recorded: steps "
                       f"1..{h['start_step']} cannot be checked")
    base = len(entries)
    for step in sorted(seg.steps):
      entries.append(Entry(step, seg, seg.steps[step]))
    for step in seg.saves:
      if step in seg.steps or step == h["start_step"]:
        saved_at[step] = base + step - h["start_step"]
    if seg.problem:
      raise AuditError(f"{seg.name}: {seg.problem}")
  return entries


def check(workdir: str) -> str:
  """Proves exactly-once per completed epoch (and no replayed or skipped step); returns the summary line."""
  return f"{workdir}: {check_entries(segments := load(workdir), lineage(segments))}"


def check_entries(segments: list[Segment], entries: list[Entry]) -> str:
  """The checks of `check` on a loaded lineage; returns the summary (raises AuditError naming the first failure)."""
  first = segments[0].header
  for seg in segments[1:]:  # The stream's facts must not change between segments (the resume guard refuses that too).
    if changed := [f"{k} {first[k]!r} -> {seg.header[k]!r}" for k in STREAM_KEYS if seg.header[k] != first[k]]:
      raise AuditError(f"{seg.name}: the input stream changed ({'; '.join(changed)})")
  spe, batch, n = first["steps_per_epoch"], first["global_batch"], first["num_examples"]
  for i, entry in enumerate(entries):
    if entry.step != i + 1:
      _not_in_order(entries, i)
    if len(entry.ids) != batch:
      raise AuditError(f"step {entry.step}: {len(entry.ids)} examples recorded, the global batch is {batch}")
  _check_order(entries)
  complete = len(entries) // spe
  for epoch in range(complete + (len(entries) % spe > 0)):
    _check_epoch(entries[epoch * spe:(epoch + 1) * spe], epoch, n)
  layouts = sorted({(s.header["process_count"], s.header["num_devices"]) for s in segments})
  return (f"steps 1..{len(entries)} in {len(segments)} segment(s) "
          f"({', '.join(f'{p}x{d // p}' for p, d in layouts)} processes x devices); "
          f"{complete} completed epoch(s) of {spe} steps, each trained on every one of {spe * batch} examples exactly "
          f"once ({n - spe * batch} of {n} sit out: split size % global batch); the partial epoch repeats none")


def _not_in_order(entries: list[Entry], i: int) -> None:
  """Names the first replayed or skipped step (position i of the lineage holds the wrong step)."""
  entry = entries[i]
  if entry.step <= i:
    earlier = next(e for e in entries[:i] if e.step == entry.step)
    raise AuditError(
        f"step {entry.step} trained twice: in {earlier.segment.name}, and again in {entry.segment.name} after it "
        f"resumed at step {entry.segment.header['start_step']} from checkpoint "
        f"{entry.segment.header['restored_from']}; example {int(entry.ids[0])} (row 0) was seen twice")
  raise AuditError(f"steps {i + 1}..{entry.step - 1} were never trained: {entry.segment.name} continued at step "
                   f"{entry.step}; example {int(entries[i].ids[0])}'s epoch misses them")


def _check_order(entries: list[Entry]) -> None:
  """Every recorded global batch is the one the global order names, where the header names that order."""
  from jaxdp.data import order, stream
  for entry in entries:
    if (h := entry.segment.header).get("order") != stream.GLOBAL:
      continue
    whole = order.GlobalOrder(h["num_examples"], h["global_batch"], h["seed"], h["split"])  # Cheap: shared epochs.
    expected = whole.rows(entry.step - 1, 0, h["global_batch"])
    if not np.array_equal(entry.ids, expected):
      row = _first_difference(entry.ids, expected)
      raise AuditError(f"step {entry.step}: row {row} read example {_at(entry.ids, row)}, but the global order "
                       f"of seed {h['seed']} puts example {_at(expected, row)} there: the reader read other rows "
                       f"than its order names (as a bad example replaced under dataset.skip_bad_examples does)")


def _check_epoch(epoch_entries: list[Entry], epoch: int, n: int) -> None:
  """No example twice in the epoch, and every id is a position in the split."""
  seen: dict[int, int] = {}
  for entry in epoch_entries:
    for row, example in enumerate(entry.ids.tolist()):
      if not 0 <= example < n:
        raise AuditError(f"step {entry.step}: example {example} (row {row}) is not in the split of {n} examples")
      if example in seen:
        raise AuditError(f"step {entry.step}: example {example} (row {row}) was already trained on at step "
                         f"{seen[example]} of epoch {epoch}")
      seen[example] = entry.step


def compare(workdir: str, other: str) -> str:
  """Proves two runs trained on the same global batches in the same order; returns the summary line."""
  a, b = lineage(load(workdir)), lineage(load(other))
  for x, y in zip(a, b):
    if x.step != y.step or not np.array_equal(x.ids, y.ids):
      row = _first_difference(x.ids, y.ids)
      raise AuditError(f"step {x.step}: the global batches differ (row {row}: example {_at(x.ids, row)} in "
                       f"{workdir}, {_at(y.ids, row)} in {other})")
  longer = f"; {other if len(b) > len(a) else workdir} has {abs(len(a) - len(b))} more" if len(a) != len(b) else ""
  return f"{workdir} and {other}: the same global batches in the same order for steps 1..{min(len(a), len(b))}{longer}"


def _first_difference(x: np.ndarray, y: np.ndarray) -> int:
  m = min(len(x), len(y))
  diff = np.flatnonzero(x[:m] != y[:m])
  return int(diff[0]) if len(diff) else m


def _at(ids: np.ndarray, row: int) -> str:
  return str(int(ids[row])) if row < len(ids) else "none"


def main(argv: list[str]) -> int:
  """0: the audit holds; 1: it does not (one line naming the first step); 2: bad usage or no records."""
  args = argv[1:]
  if args and args[0] in ("-h", "--help"):
    print(f"{USAGE}\n\n{__doc__}")
    return 0

  def audit() -> int:
    if len(args) not in (1, 2) or any(a.startswith("-") for a in args):
      raise ConfigError(f"expected one or two workdirs, got {args!r} ({USAGE})")
    try:
      print(check(args[0]) if len(args) == 1 else compare(*args))
    except AuditError as e:
      print(f"audit failed: {e}")
      return 1
    return 0

  return cli.guarded(audit)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
