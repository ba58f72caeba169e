"""Fail fast, with instructions, when a TFDS dataset is not prepared and its download is unreachable.

tfds retries unreachable downloads for minutes; this checks first, in seconds, and names the dataset,
the data_dir and how to prepare it on another machine.
"""

import socket
import threading
import time
import urllib.parse

import tensorflow_datasets as tfds

from jaxdp.config import ConfigError

PROBE_TIMEOUT_S = 10.0  # Per check, DNS included: an offline machine fails well within a minute.


def check_can_prepare(builder: tfds.core.DatasetBuilder) -> None:
  """Raises ConfigError if `builder` must download (not prepared, has download URLs) and cannot reach them."""
  if builder.is_prepared() or mocked(builder):
    return
  urls = sorted(type(builder).url_infos or {})  # The URLs whose checksums tfds registered for this dataset.
  if not urls:
    return  # Nothing to download (e.g. the builders jaxdp ships, generated from local data).
  hosts = sorted({_host_port(url) for url in urls})
  problem = unreachable(hosts, PROBE_TIMEOUT_S)
  if problem:
    name, root = builder.name, builder.data_dir_root
    raise ConfigError(
        f"dataset {name!r} is not prepared in data_dir {str(root)!r} and its download is unreachable ({problem}). "
        f"Prepare it offline: on a machine with network run `tfds build {name} --data_dir=DIR` (or "
        f"`python -c \"import tensorflow_datasets as tfds; tfds.builder('{name}', data_dir='DIR')"
        f".download_and_prepare()\"`), then copy DIR/{name} to {str(root)!r}")


def unreachable(hosts: list[tuple[str, int]], timeout: float) -> str | None:
  """None if every (host, port) accepts a TCP connection within `timeout` seconds; else what failed."""
  results: dict[tuple[str, int], str | None] = {}

  def probe(host: str, port: int) -> None:
    try:
      socket.create_connection((host, port), timeout=timeout).close()
      results[(host, port)] = None
    except OSError as e:
      results[(host, port)] = f"{host}:{port}: {e}"

  # Daemon threads with one deadline: name resolution ignores socket timeouts and may hang far longer.
  threads = [threading.Thread(target=probe, args=hp, daemon=True) for hp in hosts]
  for t in threads:
    t.start()
  deadline = time.monotonic() + timeout
  for t in threads:
    t.join(max(0.0, deadline - time.monotonic()))
  errors = [results.get(hp, f"{hp[0]}:{hp[1]}: no answer within {timeout:g} s") for hp in hosts]
  return "; ".join(e for e in errors if e) or None


def _host_port(url: str) -> tuple[str, int]:
  parts = urllib.parse.urlparse(url)
  return parts.hostname or url, parts.port or (80 if parts.scheme == "http" else 443)


def mocked(builder: tfds.core.DatasetBuilder) -> bool:
  """Under `tfds.testing.mock_data` preparing is a no-op: nothing will be downloaded."""
  return type(builder).download_and_prepare.__module__.startswith("tensorflow_datasets.testing")
