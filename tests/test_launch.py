"""The launcher relays its processes' output plainly: rank prefixes, no gloo connection lines."""

import subprocess
import sys

from jaxdp import launch

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
  script = "from jaxdp import cli; cli.setup_logging(); print('python'); cli.log.info('log')"
  env = {**launch._env(0, launch.parse(["--num_processes", "2", "--", "x"]), 1234, None)}
  out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
  assert (out.stdout, out.stderr) == ("", "python\nlog\n")  # Python's lines never meet gloo's on stdout.


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
