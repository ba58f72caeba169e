"""The command-line tools behind `python -m jaxdp.<tool>` (the library and the loop never import them)."""

import importlib
import runpy
import sys


def entry_point(name: str, tool: str) -> None:
  """`python -m jaxdp.<tool>` runs `jaxdp.tools.<tool>` as the command; an import of `jaxdp.<tool>` is that module."""
  if name == "__main__":
    runpy.run_module(f"jaxdp.tools.{tool}", run_name="__main__")
  else:
    sys.modules[name] = importlib.import_module(f"jaxdp.tools.{tool}")
