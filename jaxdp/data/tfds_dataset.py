"""A TFDS builder (a kind's maker's: `jaxdp.data.load`) as a `Dataset`, prepared once as ArrayRecord, read by index."""

import contextlib
import glob
import importlib
import importlib.util
import inspect
import os
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

import ml_collections
import tensorflow_datasets as tfds
from tensorflow_datasets.core import dataset_builder

from jaxdp import config as config_lib
from jaxdp.config import ConfigError
from jaxdp.data import cache, reader
from jaxdp.data.dataset import Dataset, Options
from jaxdp.data.source import TfdsCorpus, mocked
from jaxdp.runtime import quiet

# (name, data_dir, builder_kwargs, skip_bad, **extra) -> the builder; `extra` (e.g. file_format) is TFDS's.
MakeBuilder = Callable[..., tfds.core.DatasetBuilder]
RANDOM_ACCESS = tfds.core.file_adapters.FileFormat.ARRAY_RECORD  # What jaxdp reads by index; a user's builder prepares it.
FILE_FORMAT = RANDOM_ACCESS.value
PROBE_TIMEOUT_S = 10.0  # Per check of a download's hosts, DNS included: an offline machine fails within a minute.
# "package.module:ClassName"; a TFDS name with a version ("mnist:3.0.1", "mnist/config:3.*.*") does not match.
CLASS_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
SHIPPED = "jaxdp.datasets"  # The package of jaxdp's own builders, a module each, named as the dataset.


def open_builder(config: ml_collections.ConfigDict, kwargs: dict, make: MakeBuilder) -> Dataset:
  """The dataset of `make`'s builder, preparing it once (as ArrayRecord) if needed."""
  skip_bad = bool(config.skip_bad_examples)
  with quiet.tfds_prints():  # TFDS prints "Downloading and preparing ..." for every dataset it prepares.
    builder = open_prepared(lambda **extra: make(config.name, config.data_dir, kwargs, skip_bad, **extra))
  require_random_access(builder)
  corpus = TfdsCorpus(builder)
  options = Options.from_config(config, corpus.facts.input_shape)
  corpus.keep_encoded = bool(options.preprocess.image_size)
  return Dataset(cache.maybe_cached(corpus, options.cache_budget_mib), options, builder)


def registered(name: str, data_dir: str | None, kwargs: dict, skip_bad: bool = False,
               **extra) -> tfds.core.DatasetBuilder:
  """The TFDS builder registered as `name` ("mnist", "mnist:3.0.1", "cifar10/plain:3.*.*")."""
  del skip_bad  # Only an image folder leaves bad files out when preparing.
  module = re.split(r"[/:]", name)[0]
  if module.isidentifier() and importlib.util.find_spec(f"{SHIPPED}.{module}") is not None:
    importlib.import_module(f"{SHIPPED}.{module}")  # jaxdp's own builder: defining its class registers it with TFDS.
  try:
    return tfds.builder(name, data_dir=data_dir, **kwargs, **extra)
  except tfds.core.registered.DatasetNotFoundError:
    raise ConfigError(f"unknown dataset {name!r}: no TFDS builder of that name is registered") from None


def shipped(module: str) -> MakeBuilder:
  """The builder maker `make` of module `jaxdp.datasets.<module>`, imported when a dataset of its kind opens."""
  return lambda *args, **kwargs: importlib.import_module(f"{SHIPPED}.{module}").make(*args, **kwargs)


def user_kwargs(data_dir: str | None, kwargs: dict, extra: dict) -> dict:
  """A user's builder's keyword arguments: the data_dir, ArrayRecord, the builder_kwargs, TFDS's extras."""
  return {"data_dir": data_dir, "file_format": FILE_FORMAT, **dict(kwargs or {}), **extra}


def by_class(name: str, data_dir: str | None, kwargs: dict, skip_bad: bool = False,
             **extra) -> tfds.core.DatasetBuilder:
  """The TFDS builder class named by "package.module:ClassName", imported and instantiated."""
  del skip_bad  # Only an image folder leaves bad files out when preparing.
  cls = config_lib.import_named(name, "dataset")
  if not (inspect.isclass(cls) and issubclass(cls, tfds.core.DatasetBuilder)):
    raise ConfigError(f"dataset {name!r} is not a TFDS builder class (tfds.core.DatasetBuilder), got {cls!r}")
  kwargs = user_kwargs(data_dir, kwargs, extra)
  if missing := sorted(getattr(cls, "__abstractmethods__", ())):  # Else Python's TypeError reads as bad kwargs.
    raise ConfigError(f"dataset {name!r} does not define {', '.join(missing)} (a TFDS builder must: see "
                      f"tfds.core.GeneratorBasedBuilder)")
  if not issubclass(cls, dataset_builder.FileReaderBuilder):
    kwargs.pop("file_format")  # A builder that does not write record files takes no file format.
  try:
    return cls(**kwargs)
  except TypeError as e:  # Wrong builder_kwargs for the class (or an abstract class): a config mistake.
    raise ConfigError(f"dataset {name!r} does not accept the builder_kwargs {sorted(kwargs)}: {e}") from None


def open_prepared(make: Callable[..., tfds.core.DatasetBuilder]) -> tfds.core.DatasetBuilder:
  """`make()`'s builder, prepared once (as ArrayRecord) if it is not yet."""
  with _no_temp_dirs_left():
    builder = make()
  if mocked(builder):
    builder.download_and_prepare()  # A no-op under tfds.testing.mock_data.
  if builder.is_prepared() or mocked(builder):
    return builder
  check_can_prepare(builder)  # Fails in seconds, not after minutes of download retries.
  _prepare(make, builder)
  return make()  # Made again: a builder made before the dataset was prepared keeps empty splits.


@contextlib.contextmanager
def _no_temp_dirs_left() -> Iterator[None]:
  """Removes, on the way out, the empty temp dirs TFDS's builders made inside."""
  # A builder of a dataset not yet prepared makes one ("tmp*tfds", `DatasetInfo.initialize_from_bucket`) and keeps it.
  pattern = os.path.join(tempfile.gettempdir(), "tmp*tfds")
  before = set(glob.glob(pattern))
  try:
    yield
  finally:
    for path in set(glob.glob(pattern)) - before:
      with contextlib.suppress(OSError):  # Not empty (GCS answered), or already gone.
        os.rmdir(path)


def _prepare(make: Callable[..., tfds.core.DatasetBuilder], builder: tfds.core.DatasetBuilder) -> None:
  """Prepares the dataset as ArrayRecord under a file lock: one process prepares, the others wait."""
  root = os.fspath(builder.data_dir_root)
  with cache.locked(root, f".{builder.name}.prepare.lock"):
    with _no_temp_dirs_left():
      fresh = make(file_format=FILE_FORMAT)  # Another process may have prepared it meanwhile.
    if not fresh.is_prepared():
      reader.tensorflow()  # TFDS encodes the examples with TensorFlow.
      # In place of TFDS's prints (dropped), from whichever process holds the lock, even when process 0 only waits.
      print(f"preparing dataset {fresh.info.full_name} in {root} (once; other processes wait)", file=sys.stderr,
            flush=True)
      fresh.download_and_prepare()


def require_random_access(builder: tfds.core.DatasetBuilder) -> None:
  """A dataset prepared as TFRecord only: one line saying how to convert it."""
  if mocked(builder) or RANDOM_ACCESS in builder.info.available_file_formats():
    return
  formats = ", ".join(sorted(f.value for f in builder.info.available_file_formats())) or "unknown"
  raise ConfigError(
      f"dataset {builder.name!r} is prepared in {str(builder.data_dir)!r} as {formats} only; jaxdp reads "
      f"examples by index from ArrayRecord. Convert it once with `python -m jaxdp.data.convert "
      f"{builder.data_dir}`")


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
