"""The launcher relays its processes' output plainly, takes them down with it, and restarts them."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from jaxdp.loop import goodput
from jaxdp.tools import cli, launch

GLOO = "[Gloo] Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"


def _relayed(text: str, native: bool, capsys) -> str:
  proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.stdout.write({text!r})"], stdout=subprocess.PIPE,
                          text=True)
  launch._relay(3, proc.stdout, native)
  proc.wait()
  return capsys.readouterr().out


def test_relay_drops_gloo_pieces_from_native_output_in_any_order(capsys):
  half = GLOO.index("3 peer")  # Another thread's line cut in: "[Gloo] Rank 1 is connected to [Gloo] Rank 0 ..."
  mixed = GLOO[:half] + GLOO.replace("Rank 1", "Rank 0") + "\n" + GLOO[half:]
  seen_in_ci = "[Gloo] Rank 1 peer ranks. 0 is connected to \nExpected number of connected peer ranks is : 1\n1\n"
  text = f"{GLOO}\n\n{mixed}\n{seen_in_ci}native line 2\n"
  assert _relayed(text, True, capsys) == "[3] native line 2\n"


def test_relay_keeps_python_output_as_it_is(capsys):
  text = "loss 1\n\nstep 2\n7\ndone\n"  # A blank line and a bare number of the process stay.
  assert _relayed(text, False, capsys) == "[3] loss 1\n[3] \n[3] step 2\n[3] 7\n[3] done\n"


def test_launched_processes_print_apart_from_native_stdout(monkeypatch):
  script = "from jaxdp.runtime import process; process.setup_logging(); print('python'); process.log.info('log')"
  env = {**launch._env(0, launch.parse(["--num_processes", "2", "--", "x"]), 1234)}
  out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
  assert (out.stdout, out.stderr) == ("", "python\nlog\n")  # Python's lines never meet gloo's on stdout.


def test_the_users_xla_flags_reach_every_process_without_a_device_count(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_cpu_multi_thread_eigen=false")
  env = launch._env(0, launch.parse(["--num_processes", "2", "--devices_per_process", "2", "--", "x"]), 1234)
  assert env["XLA_FLAGS"] == "--xla_cpu_multi_thread_eigen=false" and env["JAXDP_CPU_DEVICES"] == "2"


def _launcher(*flags: str) -> launch.Launcher:
  return launch.Launcher(launch.parse([*flags, "--", "--config", "x.py", "--workdir", "/nonexistent"]))


def _restarted(launcher: launch.Launcher, failure: launch.Failure) -> int:
  """The size of the group `launcher` restarts after `failure` (it must restart)."""
  assert launcher.after(failure) is None
  return launcher.size


def test_a_config_mistake_is_never_restarted(capsys):
  assert _launcher("--num_processes", "2", "--max_restarts", "3").after(launch.Failure(1, 2, joined=True)) == 2
  assert capsys.readouterr().err == ("error: process 1 of 2 exited with status 2 (a config or command-line mistake: "
                                     "not restarted); stopped the others\n")


def test_each_restart_is_one_line_naming_rank_death_and_step_until_the_restarts_are_spent(tmp_path, capsys):
  for name in ("10", "20", "30.orbax-checkpoint-tmp-17", "best"):  # Complete entries are named by their step only.
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
  launcher = launch.Launcher(launch.parse(["--num_processes", "2", "--max_restarts", "2", "--", "--workdir",
                                           str(tmp_path)]))
  assert _restarted(launcher, launch.Failure(1, -9, joined=True)) == 2
  assert _restarted(launcher, launch.Failure(0, 1, joined=True)) == 2
  assert launcher.after(launch.Failure(1, -9, joined=True)) == 128 + 9
  assert capsys.readouterr().err.splitlines() == [
      "launch: process 1 of 2 was lost (killed by SIGKILL); restart 1 of 2 from step 20",
      "launch: process 0 of 2 exited with status 1; restart 2 of 2 from step 20",
      "error: process 1 of 2 was lost (killed by SIGKILL) after 2 restarts; stopped the others"]


def test_a_rank_that_fails_again_before_joining_is_left_out_down_to_min_processes(capsys):
  launcher = _launcher("--num_processes", "3", "--max_restarts", "9", "--min_processes", "2")
  assert _restarted(launcher, launch.Failure(2, 3, joined=False)) == 3  # A first failure at start: restarted.
  assert _restarted(launcher, launch.Failure(1, -9, joined=True)) == 3
  assert _restarted(launcher, launch.Failure(0, 3, joined=False)) == 3  # Another rank than the one that failed.
  assert _restarted(launcher, launch.Failure(0, 3, joined=False)) == 2  # Rank 0 again, before joining: gone.
  assert _restarted(launcher, launch.Failure(1, -9, joined=True)) == 2
  assert launcher.after(launch.Failure(1, 3, joined=False)) == 3  # Not below --min_processes.
  err = capsys.readouterr().err.splitlines()
  assert err[3] == ("launch: process 0 of 3 exited with status 3 again before joining the run: it cannot be restarted; "
                    "going on with 2 of 3; restart 4 of 9 from the start (no checkpoint yet)")
  assert err[-1] == ("error: process 1 of 2 exited with status 3 again before joining the run: it cannot be "
                     "restarted, and --min_processes=2 allows no fewer than 2")


@pytest.mark.parametrize("flags, named", [(["--max_restarts", "-1"], "--max_restarts"),
                                          (["--min_processes", "3"], "--min_processes"),
                                          (["--min_processes", "-1"], "--min_processes")])
def test_bad_restart_flags_are_one_line_and_exit_2(capsys, flags, named):
  with pytest.raises(SystemExit) as exit_info:
    launch.parse(["--num_processes", "2", *flags, "--", "x"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.startswith(f"error: {named}") and len(err.splitlines()) == 1, err


def test_processes_that_exit_2_are_not_restarted(tmp_path):
  out = subprocess.run([sys.executable, "-m", "jaxdp.launch", "--num_processes", "2", "--max_restarts", "3", "--",
                        "--config", str(tmp_path / "missing.py"), "--workdir", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 2, out.stderr
  assert "launch: " not in out.stderr and "not restarted" in out.stderr.splitlines()[-1], out.stderr


_ORPHAN = """
import os, signal, subprocess, sys, time
if sys.argv[1] == "middle":  # Starts the trainer stand-in, says its pid, waits to be killed.
  child = subprocess.Popen([sys.executable, __file__, "child"], env={**os.environ, "JAXDP_LAUNCHER_PID": str(os.getpid())})
  print(child.pid, flush=True)
  child.wait(timeout=600)  # A child that cannot start ends this too: the test reads EOF, not a 600 s hang.
else:  # Like a trainer under the preemption service: SIGTERM does not end it.
  from jaxdp.runtime import distributed
  distributed.die_with_launcher()
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  assert "JAXDP_LAUNCHER_PID" not in os.environ  # Its own children do not take the launcher for their parent.
  print("ready", flush=True)
  time.sleep(600)
"""


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(") ")[1][0] != "Z"  # A zombie has died already.
  except OSError:
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launched_process_dies_with_its_launcher(tmp_path):
  script = tmp_path / "orphan.py"
  script.write_text(_ORPHAN)
  middle = subprocess.Popen([sys.executable, str(script), "middle"], stdout=subprocess.PIPE, text=True)
  child = int(middle.stdout.readline())
  assert middle.stdout.readline() == "ready\n"  # The stand-in called die_with_launcher and lives on.
  assert _alive(child)
  middle.kill()
  middle.wait()
  deadline = time.time() + 10
  while _alive(child) and time.time() < deadline:
    time.sleep(0.05)
  alive = _alive(child)
  if alive:
    os.kill(child, signal.SIGKILL)
  assert not alive, "the launched process outlived its launcher"


def test_a_process_whose_launcher_is_already_gone_ends_at_once():
  script = "import os; os.environ['JAXDP_LAUNCHER_PID'] = '1'; from jaxdp.runtime import distributed; " \
           "distributed.die_with_launcher(); print('alive')"
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
  assert out.returncode == -signal.SIGKILL and "alive" not in out.stdout


def test_a_restarted_run_counts_the_time_since_the_failed_runs_last_record(tmp_path, monkeypatch):
  (tmp_path / goodput.FILE).write_text(json.dumps({"runs": 1, "seconds": {"train": 3.0, "wall": 4.0},
                                                   "saved_at": 1000.0}))
  ticks = iter([50.0, 52.0, 52.0])
  monkeypatch.setenv(goodput.ENV_RESTARTED, "1")
  clock = goodput.Clock(str(tmp_path), goodput.CompileWatch(), clock=lambda: next(ticks), now=lambda: 1007.5)
  scalars = clock.scalars()
  assert scalars["time/total/restart"] == 7.5 and scalars["time/total/wall"] == 4.0 + 7.5 + 2.0
  assert scalars["time/goodput"] == 3.0 / 13.5
  monkeypatch.delenv(goodput.ENV_RESTARTED)  # Resumed by hand (maybe days later): nothing counts as lost.
  clock = goodput.Clock(str(tmp_path), goodput.CompileWatch(), clock=lambda: 0.0, now=lambda: 1e9)
  assert clock.scalars()["time/total/restart"] == 0.0 and clock.scalars()["time/total/wall"] == 4.0


_HOLDS_A_STATE_DIR = """
import time
from jaxdp.tools import launch
with launch.state_dir() as path:
  print(path, flush=True)
  time.sleep(600)
"""


def test_the_state_dir_of_a_launcher_killed_hard_is_removed_by_the_next(tmp_path):
  env = {**os.environ, "TMPDIR": str(tmp_path)}
  holder = subprocess.Popen([sys.executable, "-c", _HOLDS_A_STATE_DIR], stdout=subprocess.PIPE, text=True, env=env)
  try:
    held = holder.stdout.readline().strip()
    assert os.path.dirname(held) == str(tmp_path) and launch.sweep(str(tmp_path)) == []  # It lives.
  finally:
    holder.kill()  # As hard as the OOM killer: its context never exits.
    holder.wait()
  other = tmp_path / f"{launch.PREFIX}someone-elses"  # No owner file: not the launcher's to judge.
  other.mkdir()
  assert os.path.isdir(held) and launch.sweep(str(tmp_path)) == [held]
  assert sorted(os.listdir(tmp_path)) == [other.name]


def test_a_launcher_removes_its_own_state_dir_when_it_ends(tmp_path, monkeypatch):
  monkeypatch.setattr(launch.tempfile, "tempdir", str(tmp_path))
  with launch.state_dir() as path:
    assert os.listdir(path) == [launch.OWNER]
  assert os.listdir(tmp_path) == []


def test_a_rank_is_left_out_only_when_the_same_process_fails_again_before_joining(capsys):
  launcher = _launcher("--num_processes", "3", "--max_restarts", "9", "--min_processes", "1")
  assert _restarted(launcher, launch.Failure(1, -9, joined=True)) == 3
  assert _restarted(launcher, launch.Failure(1, -9, joined=True)) == 3  # It had joined: restarted, not left out.
  assert _restarted(launcher, launch.Failure(0, 3, joined=False)) == 3
  assert _restarted(launcher, launch.Failure(0, 3, joined=False)) == 2  # Left out; the ranks are numbered anew, ...
  assert _restarted(launcher, launch.Failure(0, 3, joined=False)) == 2  # ... so the new rank 0 fails a first time.


def test_a_process_is_told_it_restarted_only_when_it_did(monkeypatch):
  monkeypatch.setenv(goodput.ENV_RESTARTED, "1")  # Inherited from a launcher started by a restarted one.
  args = launch.parse(["--num_processes", "2", "--", "x"])
  assert goodput.ENV_RESTARTED not in launch._env(0, args, 1234)
  assert launch._env(0, args, 1234, restarted=True)[goodput.ENV_RESTARTED] == "1"


def test_the_workdir_is_found_in_either_spelling():
  assert cli.flag_value(["--config", "c.py", "--workdir=/w"], "workdir") == "/w"
  assert cli.flag_value(["--workdir", "/v", "--config", "c.py"], "workdir") == "/v"
  assert cli.flag_value(["--config", "c.py", "--workdir"], "workdir") is None


class _Exited:
  """A process that has exited with `returncode` (what Group reads of a Popen)."""

  def __init__(self, returncode: int):
    self.returncode, self.pid = returncode, -1

  def poll(self) -> int:
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    return self.returncode


def _group(tmp_path, *codes: int) -> launch.Group:
  group = object.__new__(launch.Group)  # Its processes, without starting any.
  group.procs, group.relays = [_Exited(c) for c in codes], []
  group.joined_files = [str(tmp_path / f"joined-{r}") for r in range(len(codes))]
  return group


def test_of_two_failures_found_at_once_the_signalled_one_is_named(tmp_path):
  (tmp_path / "joined-1").touch()
  assert _group(tmp_path, 1, -9).wait() == launch.Failure(1, -9, joined=True)
  assert _group(tmp_path, -15, 1).wait() == launch.Failure(0, -15, joined=False)


def test_an_interrupted_group_exits_1_if_any_process_failed(tmp_path):
  assert _group(tmp_path, 0, -2).interrupt() == 1
  assert _group(tmp_path, 0, 0).interrupt() == 0


def test_by_default_no_rank_is_left_out(capsys):
  launcher = _launcher("--num_processes", "2", "--max_restarts", "9")
  assert _restarted(launcher, launch.Failure(0, 3, joined=False)) == 2
  assert launcher.after(launch.Failure(0, 3, joined=False)) == 3
  assert "--min_processes=2 allows no fewer than 2" in capsys.readouterr().err


def test_a_launcher_first_removes_the_state_dirs_of_launchers_that_died(tmp_path, monkeypatch):
  monkeypatch.setattr(launch.tempfile, "tempdir", str(tmp_path))
  dead = tmp_path / f"{launch.PREFIX}dead"
  dead.mkdir()
  (dead / launch.OWNER).touch()  # Its owner file, locked by no one.
  with launch.state_dir() as path:
    assert os.listdir(tmp_path) == [os.path.basename(path)]


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
  proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                           "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True,
                          start_new_session=True)
  try:
    assert proc.stdout.readline().strip() == "ready"
    stopping = threading.Thread(target=launch.stop, args=([proc], signal.SIGTERM, 0.5), daemon=True)
    stopping.start()
    stopping.join(timeout=30)
    assert not stopping.is_alive() and proc.returncode == -signal.SIGKILL
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
