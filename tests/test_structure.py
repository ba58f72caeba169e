"""The package's import graph: no cycle (eager or lazy), and the library and the loop never import a tool.

Read from the source with `ast`, so an import inside a function (a lazy one) is an edge like any other.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jaxdp"
ENTRY_POINTS = {"jaxdp.train", "jaxdp.evaluate", "jaxdp.inspect", "jaxdp.sample", "jaxdp.plot", "jaxdp.launch",
                "jaxdp.audit"}  # Thin files behind `python -m jaxdp.<tool>`: they may import the tools.
NOT_TOOLS = ("jaxdp.config", "jaxdp.build", "jaxdp.step", "jaxdp.optim", "jaxdp.parallel", "jaxdp.checkpoint",
             "jaxdp.strategies", "jaxdp.data", "jaxdp.datasets", "jaxdp.models", "jaxdp.loop", "jaxdp.report",
             "jaxdp.runtime", "jaxdp.configs")


def _modules(root: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
  """Module name -> file, for every module of the package (a package is its __init__)."""
  names = {}
  for path in root.rglob("*.py"):
    parts = path.relative_to(root.parent).with_suffix("").parts
    names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return names


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
  """The package's modules that the file imports, anywhere in it (`from a import b`: a.b if b is a module)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                for a in node.names}
  return {name for name in found if name.split(".")[0] == "jaxdp"}


def graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
  """Module -> the package's modules it imports; a name that is no module of the package is kept, to be caught."""
  modules = _modules(root)
  return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """The import cycles: strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while (w := stack.pop()) != v:
        on_stack.discard(w)
        component.append(w)
      on_stack.discard(v)
      if component:
        found.append(sorted([v, *component]))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return found


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
  return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_package_has_no_import_cycle():
  assert cycles(graph()) == []


def test_the_library_the_loop_and_the_reports_never_import_a_tool():
  wrong = {f"{m} -> {t}" for m, targets in graph().items() if _under(m, NOT_TOOLS)
           for t in targets if _under(t, ("jaxdp.tools",)) or t in ENTRY_POINTS}
  assert wrong == set()


def test_data_never_imports_the_datasets_that_register_with_it():
  wrong = {f"{m} -> {t}" for m, targets in graph().items() if _under(m, ("jaxdp.data",))
           for t in targets if _under(t, ("jaxdp.datasets",))}
  assert wrong == set()


def test_every_import_names_a_module_where_it_lives_now():
  """jaxdp's own code imports moved modules from their new homes (the old flat names are for users)."""
  modules = set(_modules())
  missing = {f"{m} -> {t}" for m, targets in graph().items() for t in targets if t not in modules}
  assert missing == set()


@pytest.mark.parametrize("edit, expected", [
    ("jaxdp/report/units.py", "cycle"),
    ("jaxdp/loop/goodput.py", "tool"),
])
def test_the_checks_catch_a_cycle_and_a_tool_import(tmp_path, edit, expected):
  """Seen failing: a lazy import that closes a cycle, and a loop module importing a tool."""
  import shutil
  copy = tmp_path / "jaxdp"
  shutil.copytree(PACKAGE, copy)
  line = "\n\ndef _late():\n  from jaxdp.report import progress  # noqa\n" if expected == "cycle" else \
      "\n\ndef _late():\n  from jaxdp.tools import cli  # noqa\n"
  with open(copy / pathlib.Path(edit).relative_to("jaxdp"), "a") as f:
    f.write(line)
  edges = graph(copy)
  if expected == "cycle":
    assert any("jaxdp.report.units" in c for c in cycles(edges))
  else:
    assert "jaxdp.tools.cli" in edges["jaxdp.loop.goodput"]
    assert _under("jaxdp.loop.goodput", NOT_TOOLS)
