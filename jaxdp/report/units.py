"""Numbers as people read them: SI prefixes, binary byte sizes, H:MM:SS durations."""


def si(value: float) -> str:
  """1.23e9 -> '1.23 G' (followed by the unit: f"{si(x)}FLOP")."""
  for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if value >= scale:
      return f"{value / scale:.3g} {unit}"
  return f"{value:.3g} "


def binary_bytes(n: int) -> str:
  """1536 -> '1.5 KiB'."""
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= scale:
      return f"{n / scale:.1f} {unit}"
  return f"{n} B"


def duration(seconds: float) -> str:
  """75 -> '0:01:15'."""
  minutes, secs = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}"
