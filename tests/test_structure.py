"""The package's import graph: no cycle (eager or lazy), and the library and the loop never import a tool.

Read from the source with `ast`, so an import inside a function (a lazy one) is an edge like any other.
"""

import ast
import pathlib
import subprocess
import sys

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


def _run(code: str) -> subprocess.CompletedProcess:
  """`code` run by a fresh interpreter (nothing imported yet), its output captured."""
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)


def test_importing_the_trainer_and_the_pipeline_loads_no_tensorflow():
  """TensorFlow feeds the input pipeline only and takes seconds to import: it loads at its first use, never with
  the package, the trainer, the tools or `jaxdp.data` (every CLI and launched process imports them)."""
  result = _run("import sys\n"
                "import jaxdp, jaxdp.train, jaxdp.evaluate, jaxdp.sample, jaxdp.datasets, jaxdp.loop.train\n"
                "from jaxdp import data\n"
                "from jaxdp.data import cache, convert, host_batches, images, reader, sampler\n"
                "print(sorted(m for m in sys.modules if m == 'tensorflow' or m.startswith('tensorflow.')))")
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("first", ["jaxdp.data", "a look-up", "tensorflow"])
def test_tensorflow_never_sees_an_accelerator_whichever_loads_first(first):
  """The one `set_visible_devices([], "GPU")` runs whether TensorFlow loads after `jaxdp.data` (at its first use),
  after a look-up that loads nothing (etils' paths, TFDS's, call `find_spec("tensorflow")`), or before `jaxdp.data`
  (a user's notebook); and quiet's own hook (Keras hidden while TensorFlow loads) is not lost to the look-up."""
  steps = {"jaxdp.data": "import jaxdp.data\nimport tensorflow\n",
           "a look-up": "import jaxdp.data, importlib.util\nimportlib.util.find_spec('tensorflow')\n"
                        "import tensorflow\n",
           "tensorflow": "import tensorflow\nimport jaxdp.data\n"}[first]
  result = _run(f"import sys\n{steps}"
                "from tensorflow.python.eager import context\n"
                "print(context.context()._visible_device_list, 'keras' in sys.modules)")  # Empty until set.
  assert result.returncode == 0, result.stderr
  assert "CPU" in result.stdout and "GPU" not in result.stdout
  if first != "tensorflow":
    assert result.stdout.split()[-1] == "False", "Keras was imported with TensorFlow"
