"""JAX's persistent compilation cache, turned on by every entry point (the CLI and the Python API alike), so that
a restart compiles nothing. JAX's own settings rule: JAX_COMPILATION_CACHE_DIR (or `jax.config`'s
`jax_compilation_cache_dir`) picks another directory, JAX_ENABLE_COMPILATION_CACHE=false turns it off."""

import os

DEFAULT_CACHE_DIR = "~/.cache/jaxdp/xla"  # Where the cache is when JAX has none.


def use() -> None:
  """Points JAX's persistent compilation cache at DEFAULT_CACHE_DIR, unless JAX has a directory or has it off.

  There every program is cached, however quickly it compiled: a restart then compiles nothing.
  """
  import jax
  if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
    return  # The user's (JAX_COMPILATION_CACHE_DIR, or set in Python), or off.
  # JAX opens its cache at the first compile after a directory is set: a process that already compiled without one
  # (a notebook) uses it from its next compile.
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(DEFAULT_CACHE_DIR))
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
