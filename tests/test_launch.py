"""The launcher relays its processes' output plainly: rank prefixes, no gloo connection lines."""

import subprocess
import sys

from jaxdp import launch

GLOO = "[Gloo] Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"


def test_relay_drops_gloo_lines_and_keeps_the_rest(capsys):
  script = f"import sys; sys.stdout.write('loss 1\\n{GLOO}\\n\\nstep 2{GLOO}\\ndone\\n')"
  proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
  launch._relay(3, proc)
  proc.wait()
  # A blank line of the process stays; gloo's line goes, also where it landed in the middle of another line.
  assert capsys.readouterr().out == "[3] loss 1\n[3] \n[3] step 2\n[3] done\n"
