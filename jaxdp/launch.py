"""`python -m jaxdp.launch`: the command `jaxdp.tools.launch`, which `import jaxdp.launch` also gives."""

from jaxdp import tools

tools.entry_point(__name__, "launch")
