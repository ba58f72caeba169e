"""JAX's persistent compilation cache, on for every entry point unless JAX's own settings say otherwise."""

import os

DEFAULT_CACHE_DIR = "~/.cache/jaxdp/xla"  # Where the cache is when JAX has none.


def use() -> None:
  """Points JAX's compilation cache at DEFAULT_CACHE_DIR for every program, unless JAX has a directory or has it off."""
  import jax
  if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
    return  # The user's (JAX_COMPILATION_CACHE_DIR, or set in Python), or off.
  # JAX opens its cache at the first compile after a directory is set: a process that already compiled without one
  # (a notebook) uses it from its next compile.
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(DEFAULT_CACHE_DIR))
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
