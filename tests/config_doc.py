"""docs/config.md, generated from jaxdp/configs/default.py: `python tests/config_doc.py` rewrites it."""

import ast
import io
import pathlib
import sys
import tokenize
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "jaxdp" / "configs" / "default.py"
PAGE = ROOT / "docs" / "config.md"
TABLE = "| key | default | meaning |\n| --- | --- | --- |"

HEADER = """# Config keys

Generated from `jaxdp/configs/default.py` by `python tests/config_doc.py`; `tests/test_docs.py` fails when the
two differ. Every config starts from these defaults; the files in `jaxdp/configs/` change a few, and
`--config.KEY=VALUE` overrides any on the command line (`--config.parallel.backend=pmap`). `config.model` and
`config.task` also take keys not listed here: they are the model's or task's keyword arguments, checked against
its signature.
"""


def _comments(source: str) -> dict[int, str]:
  """Line number -> the text of the comment on that line."""
  out = {}
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      out[tok.start[0]] = tok.string.lstrip("#").strip()
  return out


def _dotted(node: ast.expr) -> str | None:
  """`config.a.b` -> "a.b"; None for anything else."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  return ".".join(reversed(parts)) if isinstance(node, ast.Name) and node.id == "config" and parts else None


def _is_section(value: ast.expr) -> bool:
  """Whether the assigned value is `ml_collections.ConfigDict()`."""
  return isinstance(value, ast.Call) and getattr(value.func, "attr", None) == "ConfigDict"


def _meanings(source: str) -> list[tuple[str, bool, str]]:
  """(key, is a section, meaning) in file order: the block comment above an assignment, then its own comment."""
  comments, lines = _comments(source), source.splitlines()
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and (key := _dotted(node.targets[0])):
      above, line = [], node.lineno - 1
      while line in comments and lines[line - 1].lstrip().startswith("#"):
        above.insert(0, comments[line])
        line -= 1
      text = " ".join(above + ([comments[node.end_lineno]] if node.end_lineno in comments else []))
      out.append((node.lineno, key, _is_section(node.value), text))
  return [(key, section, text) for _, key, section, text in sorted(out)]


def _default(config: Any, key: str) -> str:
  """The default of `key` in the built config, as Python writes it."""
  for part in key.split("."):
    config = config[part]
  value = config.to_dict() if hasattr(config, "to_dict") else config
  return repr(value)


def _configs() -> str:
  """A table of the ready configs, each described by its module docstring's first paragraph (wrapped lines joined)."""
  rows = [f"| `jaxdp/configs/{path.name}` | {_cell(_summary(path))} |"
          for path in sorted(DEFAULT.parent.glob("*.py")) if path.name != "__init__.py"]
  return "\n## Ready configs\n\n| config | what |\n| --- | --- |\n" + "\n".join(rows) + "\n"


def _summary(path: pathlib.Path) -> str:
  """A module docstring's first paragraph, its wrapped lines joined."""
  return " ".join(ast.get_docstring(ast.parse(path.read_text())).split("\n\n")[0].split())


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def render() -> str:
  """The page's text."""
  sys.path.insert(0, str(ROOT))
  from jaxdp.config import REMOVED
  from jaxdp.configs import default
  config, rows, meanings = default.get_config(), [], _meanings(DEFAULT.read_text())
  for key, section, meaning in meanings:
    if section and any(k.startswith(key + ".") for k, _, _ in meanings):  # An empty ConfigDict is a key.
      rows.append(f"\n## `{key}`\n\n" + (f"{meaning}\n\n" if meaning else "") + TABLE)
    else:
      rows.append(f"| `{key}` | `{_cell(_default(config, key))}` | {_cell(meaning)} |")
  top = "\n## Top level\n\n" + TABLE
  removed = "\n## Removed keys\n\nSetting one is a one-line `ConfigError` naming it.\n\n| key | why |\n| --- | --- |\n"
  removed += "\n".join(f"| `{key}` | {_cell(why)} |" for key, why in REMOVED.items())
  return HEADER + _configs() + top + "\n" + "\n".join(rows) + "\n" + removed + "\n"


if __name__ == "__main__":
  PAGE.write_text(render())
  print(f"wrote {PAGE}")
