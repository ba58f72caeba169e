"""Every code block and command in README.md and docs/*.md runs, so none can go stale.

Each fenced block declares itself by its info string:
- ```text: output shown to the reader; not run (the Quickstart's sample output is checked against a real run).
- ```bash, ```sh: each command runs (a `\\` continuation joins lines; `#` lines are comments).
- ```python: runs as a script (its `assert`s are the page's checks: a GAN's bits on 1 and 2 devices, a frozen
  parameter's); one whose first line is `# NAME.py` is written to NAME.py for later blocks to use.
- ```LANG no-run (reason): not run, for what cannot run here (srun, kubectl, a GPU, your own files); the reason
  must be given.
Substitutions, so that a page stays what a user types and the test stays short: `/tmp/` becomes a temporary
directory shared by every block of every page (pages run in order: README.md, then docs/ by name), and
commands run in a working directory where `jaxdp/` is the repository's; `python -m
jaxdp.train` and `jaxdp.launch` commands get `--config.num_train_steps=3`, and `num_train_steps = N` in Python
becomes 3; `pip install ... &&` is dropped (the suite runs installed) and `python -m pytest tests` is not run
but must be what .ci/run runs; `--topology` runs only where libtpu is installed (the `tpu` extra, which CI
installs; test_topology.py skips likewise). Commands run with 2 CPU devices per process.
"""

import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

import config_doc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STEPS = 3
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
NO_RUN = re.compile(r"^no-run \((.+)\)$")


def blocks(page: pathlib.Path) -> list[tuple[int, str, str, str]]:
  """(line, language, the rest of the info string, body) of every fenced block of `page`."""
  text = page.read_text()
  out = []
  for m in FENCE.finditer(text):
    language, _, rest = m.group(1).strip().partition(" ")
    out.append((text.count("\n", 0, m.start()) + 1, language, rest.strip(), m.group(2)))
  return out


def commands(body: str) -> list[str]:
  """The commands of a shell block: continuations joined, comments and blank lines left out."""
  joined = re.sub(r"\\\n\s*", " ", body)
  return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def quickstart() -> list[str]:
  """The Quickstart section's commands, read as ../shared/tools/fresh-quickstart reads them (every block)."""
  text = (ROOT / "README.md").read_text()
  section = re.search(r"^## Quickstart$(.*?)(?=^## )", text, re.M | re.S).group(1)
  return [c for body in re.findall(r"```[a-z]*\n(.*?)```", section, re.S) for c in commands(body)]


def ci_test_command() -> str:
  """The last command .ci/run runs: the suite."""
  return [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()][-1].strip()


def shortened(command: str, tmp: pathlib.Path) -> str | None:
  """`command` as the test runs it, or None where it is not run here (the suite itself)."""
  command = command.replace("/tmp/", f"{tmp}/")
  command = re.sub(r"^pip install [^&]*&&\s*", "", command)
  if command.startswith("python -m pytest") or ("--topology" in command and not importlib.util.find_spec("libtpu")):
    return None
  if re.search(r"python -m jaxdp\.(train|launch)\b", command):
    command += f" --config.num_train_steps={STEPS}"
  return command


def run(argv: list[str], cwd: pathlib.Path, where: str, fresh: bool = False) -> str:
  """Runs `argv` in `cwd` with 2 CPU devices (`fresh`: JAX's own, as on a fresh machine); fails naming `where` and
  the output's end when it fails."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)]), "JAXDP_CPU_DEVICES": "2"}
  if fresh:
    env.pop("JAXDP_CPU_DEVICES")
  p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, f"{where}: {shlex.join(argv)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}"
  return p.stdout + p.stderr


def summary(output: str) -> list[str]:
  """The start summary's lines (after the `jaxdp` line) that do not vary from run to run."""
  lines = output[output.index("jaxdp\n"):].splitlines()[1:]
  kept = []
  for line in lines:
    if not line.startswith("  "):
      break
    kept.append(line.split()[0] if line.split()[0] in ("compile", "compute", "cpu_devs", "input", "schedule")
                else line.strip())
  return kept


def test_every_block_declares_what_it_is_and_no_run_says_why():
  for page in PAGES:
    for line, language, rest, _ in blocks(page):
      where = f"{page.name}:{line}"
      assert language in ("text", "bash", "sh", "python"), f"{where}: a fenced block declares its language"
      assert not rest or NO_RUN.match(rest), f"{where}: '{rest}': only `no-run (reason)` may follow the language"


def test_the_quickstart_is_two_commands_and_its_test_command_is_what_ci_runs():
  assert len(found := quickstart()) == 2, f"the Quickstart's code blocks hold {found}"
  first, second = found
  assert first.startswith('pip install -e ".[test]" && python -m jaxdp.train'), first
  assert second == ci_test_command() == "python -m pytest tests"


def _anchor(heading: str) -> str:
  """A Markdown heading's anchor, as GitHub makes it: lower case, spaces to dashes, other punctuation dropped."""
  return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def cited_sections_missing(root: pathlib.Path = ROOT) -> list[str]:
  """Each `docs/PAGE.md#anchor` that code under jaxdp/ cites and that no heading of PAGE makes, as `file: cite`."""
  missing = []
  for path in sorted((root / "jaxdp").rglob("*.py")):
    for page, anchor in re.findall(r"docs/([\w-]+\.md)#([\w-]+)", path.read_text()):
      doc = root / "docs" / page
      headings = re.findall(r"^#+ (.+)$", doc.read_text(), re.M) if doc.exists() else []
      if anchor not in map(_anchor, headings):
        missing.append(f"{path.relative_to(root)}: docs/{page}#{anchor}")
  return missing


def test_every_section_the_code_cites_exists():
  assert not cited_sections_missing()


def test_the_citation_check_catches_a_section_that_is_gone(tmp_path):
  (tmp_path / "jaxdp").mkdir()
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "notes.md").write_text("# Notes\n\n## Loop host costs\n")
  (tmp_path / "jaxdp" / "m.py").write_text("# docs/notes.md#loop-host-costs and docs/notes.md#nan-guard\n")
  assert cited_sections_missing(tmp_path) == ["jaxdp/m.py: docs/notes.md#nan-guard"]


def test_config_md_is_generated_from_the_default_config():
  assert (ROOT / "docs" / "config.md").read_text() == config_doc.render(), "run: python tests/config_doc.py"


def test_every_block_runs_and_the_sample_output_is_todays(tmp_path, data_dir, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", data_dir)  # `digits`, prepared once for the session.
  work = tmp_path / "cwd"  # Pages name repository paths (jaxdp/configs/...); files they write stay out of it.
  work.mkdir()
  (work / "jaxdp").symlink_to(ROOT / "jaxdp")
  outputs = {}
  for page in PAGES:
    for line, language, rest, body in blocks(page):
      where = f"{page.name}:{line}"
      if language == "text" or rest:
        continue
      if language == "python":
        name = re.match(r"# (\w+\.py)\n", body)
        script = work / (name.group(1) if name else "block.py")
        script.write_text(re.sub(r"num_train_steps = \d+", f"num_train_steps = {STEPS}",
                                 body.replace("/tmp/", f"{tmp_path}/")))
        if name:  # A module for later blocks: they run it.
          assert name.group(1)[:-3] in page.read_text()[page.read_text().index(body) + len(body):], f"{where}: unused"
        else:
          outputs[where] = run([sys.executable, script.name], work, where)
        continue
      for command in commands(body):
        if (short := shortened(command, tmp_path)) is not None:
          outputs[f"{where}: {command}"] = run(["bash", "-c", short], work, where, fresh=command == quickstart()[0])
  sample = next(body for _, language, _, body in blocks(ROOT / "README.md") if language == "text")
  train = next(out for where, out in outputs.items() if where.startswith("README.md") and "jaxdp.train" in where)
  assert summary(sample + "\n") == summary(train), "README's sample output: paste today's (the Quickstart's)"
