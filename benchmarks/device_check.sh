#!/usr/bin/env bash
# Issue 25's accelerator check as one command for the `device` tool: benchmarks/gpu_check.py (GPT-2 small
# tokens/s and MFU, ResNet-18 images/s) with XLA's defaults, then with the flags JAX's GPU performance guide
# recommends, then benchmarks/overhead.py on one device (what the NaN guard's branch costs there:
# docs/design-notes.md#nan-guard), then benchmarks/fsdp_step.py on one device, then benchmarks/invariant_check.py
# (invariant mode bitwise on 1 and 2 devices), each under its own time limit; results and logs in $OUT.
#
# The H200 machine has jax (CUDA), flax and optax, but neither ml_collections (which jaxdp's configs import)
# nor a network. So, here, once per session, fetch it as a wheel for its Python 3.12:
#     grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl ml_collections==1.1.0
# then call the tool's run with command="bash benchmarks/device_check.sh", carry=[".whl"], timeout_s=600 (270 + 200 + 60 + 45 s of runs).
# SIZE=tiny runs the same at a toy size (on a CPU, to try this script); ARGS adds gpu_check flags to both runs;
# PYTHON names the interpreter (default python3, the one that holds JAX there).
set -uo pipefail
out=${OUT:-/tmp/device_check}
size=${SIZE:-gpu}
python=${PYTHON:-python3}
read -r -a extra <<< "${ARGS:-}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: installing the carried wheels failed"; exit 2; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "$python" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__)"
  "$python" -c "import jax; print(jax.devices())"; } 2>&1 | tee "$out/device.txt"
# Each run is capped so that the second still runs inside one call (the session has 15 device minutes in all).
timeout 270 "$python" benchmarks/gpu_check.py --size "$size" "${extra[@]}" --out "$out/gpu_check_defaults.json" 2>&1 \
  | tee "$out/gpu_check_defaults.log"
XLA_FLAGS="--xla_gpu_triton_gemm_any=true --xla_gpu_enable_latency_hiding_scheduler=true" \
  timeout 200 "$python" benchmarks/gpu_check.py --size "$size" "${extra[@]}" --out "$out/gpu_check_guide_flags.json" 2>&1 \
  | tee "$out/gpu_check_guide_flags.log"
overhead=(--rounds 21 --steps 5 --workloads mlp,cnn); [ "$size" = tiny ] && overhead=(--rounds 1 --steps 1 --workloads mlp)
timeout 60 "$python" benchmarks/overhead.py --real_devices --devices 1 "${overhead[@]}" --out "$out/overhead.md" 2>&1 \
  | tee "$out/overhead.log"
# FSDP against plain DDP on the one GPU: nothing sharded on one device, so the ratio is what the FSDP path costs.
fsdp=(--rounds 11 --steps 5 --workloads mlp,mlp4x2048); [ "$size" = tiny ] && fsdp=(--rounds 1 --steps 1 --workloads mlp)
timeout 60 "$python" benchmarks/fsdp_step.py --real_devices --devices 1 "${fsdp[@]}" --out "$out/fsdp_step.md" 2>&1 \
  | tee "$out/fsdp_step.log"
# Invariant mode bitwise on 1 and 2 devices (with one GPU: two runs on it), its steps compiled with XLA's
# deterministic ops on GPUs; SIZE=tiny (a CPU) compares 1 and 2 simulated CPU devices.
invariant=(); [ "$size" = tiny ] && invariant=(--cpu_devices 2 --steps 2)
timeout 45 "$python" benchmarks/invariant_check.py "${invariant[@]}" --out "$out/invariant.json" 2>&1 \
  | tee "$out/invariant.log"
