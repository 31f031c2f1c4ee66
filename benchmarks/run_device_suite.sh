#!/usr/bin/env bash
# The GPU side of the test suite and the kernel/collective benchmarks, staged so each stage fits one
# 10-minute device command. Run from the repository root of a GPU machine; with fewer GPUs than a test's ranks,
# the ranks share the GPUs over gloo (tests/dist_spawn.py, the shared_gpu key), so one GPU runs every
# multi-rank case; NCCL runs where there is a GPU per rank. The collectives stage needs 2+ GPUs (NCCL):
#   GIT_REV=<short sha> OUT=<dir> bash benchmarks/run_device_suite.sh tests kernels     # GPU tests, kernel tables
#   GIT_REV=<short sha> OUT=<dir> bash benchmarks/run_device_suite.sh collectives       # NVLink + emulated socket net
#   GIT_REV=<short sha> OUT=<dir> bash benchmarks/run_device_suite.sh sign              # the sign codec table only
#   GIT_REV=<short sha> OUT=<dir> bash benchmarks/run_device_suite.sh learned           # learned vs min-max kernels
# Logs and tables land in $OUT; each stage's exit status is printed at the end.
set -uo pipefail
: "${GIT_REV:?set GIT_REV to the commit under test}"
export OUT=${OUT:-/tmp/out}
source "$(dirname "$0")/device_env.sh" || exit 1
status=()
run() {  # run NAME COMMAND...: tee the log into $OUT and remember the exit status
  local name=$1; shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$OUT/$name.log" | tail -25
  status+=("$name=${PIPESTATUS[0]}")
}
for stage in "$@"; do
  case $stage in
    sweep) run bench_kernels_sweep timeout 100 python3 benchmarks/bench_kernels.py --sweep ;;
    tests) run pytest_gpu timeout ${TESTS_TIMEOUT_S:-540} python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/quant tests/kernels tests/comm tests/schemes tests/config tests/engine tests/auto tests/optim tests/fsdp2 tests/fsdp1 tests/ddp \
      tests/algorithms tests/recipes/models \
      tests/test_train.py tests/test_shared_gpu.py ;;
    kernels)
      run bench_kernels timeout 170 python3 benchmarks/bench_kernels.py
      run bench_symmetric_hadamard timeout 110 python3 benchmarks/bench_symmetric_hadamard.py
      run bench_sign timeout 90 python3 benchmarks/bench_sign.py ;;
    sign) run bench_sign timeout 90 python3 benchmarks/bench_sign.py ;;
    learned) run bench_kernels_learned timeout 150 python3 benchmarks/bench_kernels.py --learned ;;
    collectives)
      run bench_collectives_nvlink timeout 240 python3 benchmarks/bench_collectives.py
      run bench_collectives_socket env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo \
        timeout 300 python3 benchmarks/bench_collectives.py ;;
    *) echo "unknown stage '$stage'; allowed: tests kernels sign learned sweep collectives"; exit 2 ;;
  esac
done
echo "stage status: ${status[*]}"
