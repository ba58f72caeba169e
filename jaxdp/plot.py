"""`python -m jaxdp.plot`: the command `jaxdp.tools.plot`, which `import jaxdp.plot` also gives."""

from jaxdp import tools

tools.entry_point(__name__, "plot")
