"""The launcher relays its processes' output plainly: rank prefixes, no gloo connection lines."""

import subprocess
import sys

from jaxdp import launch

GLOO = "[Gloo] Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"


def test_relay_drops_gloo_lines_and_keeps_the_rest(capsys):
  half = GLOO.index("3 peer")  # Another thread's line cut in: "[Gloo] Rank 1 is connected to [Gloo] Rank 0 ..."
  mixed = GLOO[:half] + GLOO.replace("Rank 1", "Rank 0") + "\\n" + GLOO[half:]
  script = f"import sys; sys.stdout.write('loss 1\\n{GLOO}\\n\\nstep 2{GLOO}\\n{mixed}\\ndone\\n')"
  proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
  launch._relay(3, proc)
  proc.wait()
  # A blank line of the process stays; gloo's line goes, also where it landed in the middle of another line.
  assert capsys.readouterr().out == "[3] loss 1\n[3] \n[3] step 2\n[3] done\n"


def test_cpu_shares_split_the_cores_without_overlap():
  cores = [0, 1, 2, 3, 4, 5, 6, 7]
  assert [launch.cpu_share(r, 3, cores) for r in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
  assert [launch.cpu_share(r, 3, [4, 5]) for r in range(3)] == [[4], [5], [4]]  # More processes than cores.


def test_pinned_processes_get_their_share_and_thread_counts(monkeypatch):
  monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
  args = launch.parse(["--num_processes", "2", "--pin_cpus", "--", "--config", "x.py"])
  shares = launch._shares(args)
  cores = sorted(launch.os.sched_getaffinity(0))
  assert sorted(c for share in shares for c in share) == (cores if len(cores) >= 2 else cores * 2)
  assert launch._env(1, args, 1234, shares[1])["OMP_NUM_THREADS"] == str(len(shares[1]))
  assert launch._shares(launch.parse(["--num_processes", "2", "--", "x"])) == [None, None]  # Off by default.


def test_the_users_xla_flags_reach_every_process_without_a_device_count(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_cpu_multi_thread_eigen=false")
  env = launch._env(0, launch.parse(["--num_processes", "2", "--devices_per_process", "2", "--", "x"]), 1234, None)
  assert env["XLA_FLAGS"] == "--xla_cpu_multi_thread_eigen=false" and env["JAXDP_CPU_DEVICES"] == "2"
