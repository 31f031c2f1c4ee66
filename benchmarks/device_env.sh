#!/usr/bin/env bash
# Source this first on an offline GPU host (no PyPI access): installs the wheels tools/gpu_wheels.sh put in .whl/
# (copied over with the checkout) and sets the environment the recorded GPU runs used. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# Installed once per host and wheel set (a stamp of their names): later shells on the same host skip it.
wheel_stamp=$(ls .whl 2>/dev/null | md5sum | cut -c1-16)
if [[ $(cat /tmp/site/.wheel_stamp 2>/dev/null) != "$wheel_stamp" ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { echo "wheel install failed: run tools/gpu_wheels.sh on a machine with PyPI access first"; return 1; }
  echo "$wheel_stamp" > /tmp/site/.wheel_stamp
fi
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, composer, streaming; print('torch', torch.__version__, 'triton', triton.__version__, 'composer', composer.__version__, 'gpus', torch.cuda.device_count())"
