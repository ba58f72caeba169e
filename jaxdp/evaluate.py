"""`python -m jaxdp.evaluate`: the command `jaxdp.tools.evaluate`, which `import jaxdp.evaluate` also gives."""

from jaxdp import tools

tools.entry_point(__name__, "evaluate")
