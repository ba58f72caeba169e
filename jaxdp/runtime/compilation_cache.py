"""JAX's persistent compilation cache, pointed at `config.compilation_cache_dir` by every entry point
(the CLI and the Python API alike), so that a restart compiles nothing."""

import os

import ml_collections

DEFAULT_CACHE_DIR = "~/.cache/jaxdp/xla"  # configs/default.py's compilation_cache_dir.


def use(config: ml_collections.ConfigDict) -> None:
  """Points JAX's persistent compilation cache at `config.compilation_cache_dir` ("" or None: off).

  JAX_COMPILATION_CACHE_DIR in the environment wins over the default directory (not over a directory
  given explicitly). Every program is cached, however quickly it compiled: a restart then compiles nothing.
  """
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  path = config.compilation_cache_dir
  if os.environ.get("JAX_COMPILATION_CACHE_DIR") and path == DEFAULT_CACHE_DIR:
    return
  wanted = os.path.expanduser(path) if path else None
  if wanted != jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", wanted)
    # JAX opens its cache once, at the first compile: a process that already compiled (a notebook, a second
    # run) would keep writing to the old directory without this.
    compilation_cache.reset_cache()
  if path and "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
