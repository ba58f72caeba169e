#!/bin/bash
# jaxdp.launch with and without --pin_cpus, alternating (ABAB): 2 processes x 1 device, MLP, 300 steps.
# Prints wall time, the run's final "done" line (ms/step over the timed steps) and the load average.
# Measured on the shared 2-core dev machine (load 5-7): pinned 66.8 / 67.2 ms/step, unpinned 24.7 / 30.0.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/jaxdp-launch-pinning}
for round in 1 2; do
  for pin in --pin_cpus --no-pin_cpus; do
    w=$out/${round}${pin}; rm -rf "$w"; mkdir -p "$w"
    start=$(date +%s.%N)
    python -m jaxdp.launch --num_processes 2 --devices_per_process 1 $pin -- --config jaxdp/configs/default.py \
      --workdir "$w" --config.model.name=mlp --config.num_train_steps=300 --config.log_every_steps=100 \
      --config.eval_every_steps=1000 --config.checkpoint_every_steps=0 --config.batch_size=256 \
      --config.check_replicas_every_steps=0 > "$w/out.txt" 2>&1
    end=$(date +%s.%N)
    echo "$round $pin wall $(echo "$end - $start" | bc) s | $(grep '\] done' "$w/out.txt") | load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
