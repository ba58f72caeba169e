"""The package's import graph: no cycle (eager or lazy), and the library and the loop never import a tool.

Read from the source with `ast`, so an import inside a function (a lazy one) is an edge like any other.
"""

import ast
import os
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


TRAINER = ("jaxdp.loop.train", "jaxdp.loop.periodic")  # `train_and_evaluate`: one loop on the public library.
TRAINER_MAY_IMPORT = ("jaxdp.library", "jaxdp.build", "jaxdp.config", "jaxdp.loop", "jaxdp.report", "jaxdp.runtime")


def trainer_reaches_past_the_library(edges: dict[str, set[str]]) -> set[str]:
  """The trainer's imports of the library's insides (steps, backends, feed, checkpoints, data, strategies):
  it reaches them only through `jaxdp.DataParallel`, and the config's objects through `build.resolve`."""
  return {f"{m} -> {t}" for m in TRAINER for t in edges[m] if not _under(t, TRAINER_MAY_IMPORT)}


def test_the_trainer_reaches_the_library_only_through_data_parallel():
  assert trainer_reaches_past_the_library(graph()) == set()


def test_the_trainer_check_catches_a_reach_past_the_library(tmp_path):
  """Seen failing: the loop importing the checkpoints module itself."""
  import shutil
  copy = tmp_path / "jaxdp"
  shutil.copytree(PACKAGE, copy)
  with open(copy / "loop" / "train.py", "a") as f:
    f.write("\n\ndef _late():\n  from jaxdp import checkpoint  # noqa\n")
  assert trainer_reaches_past_the_library(graph(copy)) == {"jaxdp.loop.train -> jaxdp.checkpoint"}


def imports_up_into_the_loop(edges: dict[str, set[str]]) -> set[str]:
  """Imports of the loop from below it: the library (`DataParallel` and its parts), the reports, the runtime, the
  data, the models, the tasks and the strategies stand under the loop, which is built on them."""
  return {f"{m} -> {t}" for m, targets in edges.items()
          if not _under(m, ("jaxdp.loop", "jaxdp.tools")) and m not in ENTRY_POINTS and m != "jaxdp"
          for t in targets if _under(t, ("jaxdp.loop",))}


def test_nothing_below_the_loop_imports_it():
  assert imports_up_into_the_loop(graph()) == set()


@pytest.mark.parametrize("edit, line, edge", [
    ("library.py", "from jaxdp.loop import evaluate", "jaxdp.library -> jaxdp.loop.evaluate"),
    ("report/metrics.py", "from jaxdp.loop.hooks import Hook", "jaxdp.report.metrics -> jaxdp.loop.hooks"),
])
def test_the_layer_check_catches_an_import_up_into_the_loop(tmp_path, edit, line, edge):
  """Seen failing: the library's exact evaluation and the reports' `Hook` imported from the loop, as they were."""
  import shutil
  copy = tmp_path / "jaxdp"
  shutil.copytree(PACKAGE, copy)
  with open(copy / edit, "a") as f:
    f.write(f"\n\ndef _late():\n  {line}  # noqa\n")
  assert imports_up_into_the_loop(graph(copy)) == {edge}


def imports_after_code(root: pathlib.Path = PACKAGE) -> set[str]:
  """Module-level imports below code (`noqa: E402`): a module's imports come first (a docstring and annotations-only
  `if TYPE_CHECKING:` imports aside); what must load late is imported inside the function that needs it."""
  found = set()
  for name, path in _modules(root).items():
    code = False
    for node in ast.parse(path.read_text(), str(path)).body:
      if isinstance(node, ast.Import | ast.ImportFrom):
        found |= {f"{name}:{node.lineno}"} if code else set()
      elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                or isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"):
        code = True
  return found


def test_every_module_imports_before_its_code():
  """Seen failing on tools/sample.py as it was (its `--help` check, then JAX imported below it)."""
  assert imports_after_code() == set()


def test_data_never_imports_the_datasets_by_name():
  """It imports one by module path, when a config names it (`tfds_dataset.SHIPPED`)."""
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
  """`code` run by a fresh interpreter (nothing imported yet) in this environment without TensorFlow's and libtpu's
  variables (as a user's shell has it: this process's imports set some), its output captured."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "TPU_"))}
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                        env=env)


def test_importing_the_trainer_and_the_pipeline_loads_no_tensorflow():
  """TensorFlow feeds the input pipeline only and takes seconds to import: it loads at its first use, never with
  the package, the trainer, the tools or `jaxdp.data` (every CLI and launched process imports them)."""
  result = _run("import sys\n"
                "import jaxdp, jaxdp.train, jaxdp.evaluate, jaxdp.sample, jaxdp.datasets, jaxdp.loop.train\n"
                "from jaxdp import data\n"
                "from jaxdp.data import cache, convert, order, preprocess, reader, stream\n"
                "print(sorted(m for m in sys.modules if m == 'tensorflow' or m.startswith('tensorflow.')))")
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "[]"


SIDE_EFFECTS = ("import os, sys\n"
                "hooks, env, loaded = list(sys.meta_path), dict(os.environ), set(sys.modules)\n"
                "{imports}\n"
                "print([type(f).__module__ for f in sys.meta_path if f not in hooks], "
                "sorted(k for k in {{*env, *os.environ}} if env.get(k) != os.environ.get(k)), "
                "sorted((set(sys.modules) - loaded) & {{'jax', 'tensorflow', 'flax'}}))")


def test_importing_jaxdp_changes_nothing_in_the_process():
  """No import hook, no environment variable, and neither JAX nor TensorFlow loaded."""
  result = _run(SIDE_EFFECTS.format(imports="import jaxdp"))
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "[] [] []"


def test_importing_the_pipeline_and_the_trainer_adds_no_import_hook_and_sets_no_variable():
  """Neither does jaxdp's own code (JAX and libtpu set variables at their import, absl's flags and six add finders:
  they are loaded first) nor does it load TensorFlow."""
  result = _run("import jax, flax, absl.flags, six\n" + SIDE_EFFECTS.format(
      imports="import jaxdp.data, jaxdp.datasets, jaxdp.loop.train, jaxdp.train"))
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "[] [] []"


def test_tensorflow_is_imported_by_the_reader_only():
  """`reader.tensorflow()` is jaxdp's one way to TensorFlow (annotations aside), so its set-up always runs."""
  found = set()
  for name, path in _modules().items():
    tree = ast.parse(path.read_text(), str(path))
    annotations_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and
                        getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}
    found |= {name for node in ast.walk(tree) if id(node) not in annotations_only
              for imported in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                               [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
              if imported.split(".")[0] == "tensorflow"}
  assert found == {"jaxdp.data.reader"}


TF_SETUP_FIRST = """import importlib.abc, sys, traceback
class First(importlib.abc.MetaPathFinder):  # Records who imports TensorFlow first (an import, not a look-up).
  def find_spec(self, name, path, target=None):
    if name == "tensorflow" and any(f.name == "_find_and_load" for f in traceback.extract_stack()):
      sys.meta_path.remove(self)
      print("tensorflow first imported from", "reader" if any(f.filename.endswith("data/reader.py")
            for f in traceback.extract_stack()) else traceback.format_stack()[-8:], flush=True)
sys.meta_path.insert(0, First())
"""


@pytest.mark.parametrize("first", ["reader", "tensorflow"])
def test_tensorflow_never_sees_an_accelerator(first):
  """`reader.tensorflow()` hides TensorFlow's GPUs (and TPUs) whether TensorFlow was loaded before it (a user's
  notebook) or by it; its start-up variables are set only when it imports TensorFlow itself."""
  result = _run("import os, sys\nos.environ.pop('TF_ENABLE_ONEDNN_OPTS', None)\n"
                + ("import tensorflow\n" if first == "tensorflow" else "") +
                "from jaxdp.data import reader\ntf = reader.tensorflow()\n"
                "from tensorflow.python.eager import context\n"
                "print(context.context()._visible_device_list, tf is sys.modules['tensorflow'], "
                "os.environ.get('TF_ENABLE_ONEDNN_OPTS'))")
  assert result.returncode == 0, result.stderr
  assert "CPU" in result.stdout and "GPU" not in result.stdout  # Empty until set.
  assert result.stdout.split()[-2:] == (["True", "0"] if first == "reader" else ["True", "None"])


def test_tensorflow_whose_devices_are_fixed_already_is_one_warning():
  """A notebook's TensorFlow ran ops before jaxdp's first use (on a GPU machine its devices are then fixed)."""
  result = _run("import logging, tensorflow as tf\nlogging.basicConfig()\n"
                "def fixed(*args): raise RuntimeError('Visible devices cannot be modified after being initialized')\n"
                "tf.config.set_visible_devices = fixed\n"
                "from jaxdp.data import reader\nprint(reader.tensorflow() is tf)")
  assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr
  assert "may hold accelerator memory" in result.stderr


def test_the_pipeline_imports_tensorflow_through_the_reader(tmp_path):
  """Preparing (TFDS encodes with TensorFlow), reading by index, decoding, streaming: TensorFlow's first import
  always comes through `reader.tensorflow()`, so no TFDS call reaches it before its GPUs are hidden."""
  runs = {"prepare": f"data.load(ConfigDict({{'name': 'digits', 'data_dir': {str(tmp_path / 'a')!r}}}))",
          "stream": f"ds = data.load(ConfigDict({{'name': 'digits', 'data_dir': {str(tmp_path / 'a')!r}, "
                    "'cache_mb': 0}))\nnext(data.eval_batches(ds, 'test', global_batch=32, process_index=0, process_count=1))"}
  for name, code in runs.items():  # The second finds `digits` prepared: decoding loads TensorFlow.
    result = _run(TF_SETUP_FIRST + "from ml_collections import ConfigDict\nfrom jaxdp import data\n" + code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tensorflow first imported from reader" in result.stdout, (name, result.stdout)
