#!/usr/bin/env bash
# The GPU checks of issue #3, as one script for a lent CUDA machine (bench/README in
# BENCHMARKS.md): the CUDA tests (no host sync in a watched step under
# torch.cuda.set_sync_debug_mode("error"); norms through cuDNN equal autograd's) and the
# overhead benchmarks on the device. Expects wheels of gradwatch and websockets in .gpu/
# (built by the caller: pip wheel --no-deps -w .gpu . ; pip download websockets -d .gpu).
set -u
out=${OUT:-/tmp/gradwatch-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, sys; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
} 2>&1 | tee "$out/gpu.txt"
python3 -m pip install -q --no-deps --no-index .gpu/*.whl 2>&1 | tail -n 2
timeout 180 python3 -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" \
  tests/trainer_hooks/test_monitor_cuda.py tests/trainer_hooks/test_timesteps_cuda.py 2>&1 | tee "$out/pytest.txt"
timeout 120 python3 bench/overhead.py --device cuda --threads 4 --rounds 7 2>&1 | tee "$out/overhead.txt"
timeout 60 python3 bench/capture_cost.py --device cuda 2>&1 | tee "$out/capture_cost.txt"
