#!/usr/bin/env bash
# The GPU side of the test suite and the kernel/collective benchmarks, in stages, on one GPU host. Run from the
# repository root; every stage writes into the results folder named on the command line:
#   bash benchmarks/gpu_suite.sh --results DIR tests-kernels              # one stage
#   bash benchmarks/gpu_suite.sh --results DIR tests faults kernels       # several, one after the other
#   bash benchmarks/gpu_suite.sh --results DIR --env benchmarks/device_env.sh tests   # an offline host's wheels
# With fewer GPUs than a test's ranks, the ranks share the GPUs over gloo (tests/dist_spawn.py, the shared_gpu
# key), so one GPU runs every multi-rank case; NCCL runs where there is a GPU per rank. Stages
# (benchmarks/README.md, "The GPU suite", says how long each takes):
#   tests-kernels tests-comm tests-fsdp tests-train   the GPU-marked tests (pytest -m gpu) in four parts
#   tests-kernels-compiled                            the unmarked kernel tests, compiled here: CI runs them under the
#                                                     Triton interpreter; tests = these five stages
#   faults-saving faults-other faults-rank            the launcher fault cases, ranks on the GPU; faults = all three
#   kernels sign learned sweep                        kernel benchmark tables
#   collectives                                       NVLink and emulated-socket collective tables (2+ GPUs)
# A pytest stage NAME stops after ${NAME}_TIMEOUT_S seconds (upper case, '-' as '_', e.g. TESTS_COMM_TIMEOUT_S;
# default 1800) with SIGINT, so that pytest still writes its junit xml and its slowest durations (SIGKILL 30 s
# later): a hung case cannot hold the host for ever.
#
# In the results folder: each stage's log (a pytest stage's ends in its 40 slowest durations) and a pytest stage's
# junit xml (NAME.xml), the benchmark tables (.md, .json), environment.log (the GPUs and versions) and summary.txt
# (each stage's exit status, seconds and pytest result line, and the failing cases), rewritten after every stage.
# Running again into the same folder adds to it (a stage run again replaces its line). The exit status is 0 when
# every stage of this call passed, 1 otherwise, 2 for a misspelt stage or option.
set -uo pipefail

usage() { echo "usage: gpu_suite.sh --results DIR [--env FILE] STAGE..."; }
RESULTS=
ENV_SCRIPT=
stages=()
while (($#)); do
  case $1 in
    --results) RESULTS=${2:-}; shift 2 || { usage; exit 2; } ;;
    --env) ENV_SCRIPT=${2:-}; shift 2 || { usage; exit 2; } ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "unknown option '$1'"; usage; exit 2 ;;
    *) stages+=("$1"); shift ;;
  esac
done
[[ -n $RESULTS ]] || { echo "name the results folder: --results DIR"; usage; exit 2; }

TESTS_KERNELS=(tests/quant tests/kernels)
# Every launch against the torch reference, bit for bit: unmarked because they run anywhere
# (tests/kernels/kernel_device.py), so -m gpu leaves them out.
TESTS_KERNELS_COMPILED=(tests/kernels)
TESTS_COMM=(tests/comm tests/schemes tests/config tests/engine tests/auto tests/optim)
TESTS_FSDP=(tests/fsdp2 tests/fsdp1 tests/ddp)
TESTS_TRAIN=(tests/algorithms tests/recipes/models tests/test_train.py tests/test_shared_gpu.py
             tests/test_same_device_pg.py)
LAUNCHER_FAULTS=(tests/faults/test_launcher_faults.py)
RANK_FAULTS=(tests/faults/test_rank_exception.py)
STAGES="tests tests-kernels tests-comm tests-fsdp tests-train tests-kernels-compiled"
STAGES+=" faults faults-saving faults-other faults-rank kernels sign learned sweep collectives"

for stage in "${stages[@]}"; do  # refuse a misspelt stage before anything is written
  [[ " $STAGES " == *" $stage "* ]] || { echo "unknown stage '$stage'; allowed: $STAGES"; exit 2; }
done
((${#stages[@]})) || { echo "name at least one stage; allowed: $STAGES"; exit 2; }
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)  # the stages run from the repository root

timeout_var() { tr '[:lower:]-' '[:upper:]_' <<< "${1}_TIMEOUT_S"; }  # the timeout variable of stage $1

summary() {  # one line per stage run into $RESULTS so far: name, exit status, seconds, pytest's result line
  echo "GPU suite, git ${GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(hostname)," \
    "$(date -u +%FT%TZ)"
  grep -m4 -E "^[0-9]+, |^torch " "$RESULTS/environment.log" 2>/dev/null
  printf '%-26s %6s %8s  %s\n' stage status seconds result
  [[ -f $RESULTS/stages.tsv ]] && while IFS=$'\t' read -r name rc seconds; do
    local result
    result=$(grep -E "[0-9]+ (passed|failed|error|errors|skipped|deselected)|no tests ran|Interrupted" \
      "$RESULTS/$name.log" 2>/dev/null | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')
    [[ $rc == 124 || $rc == 137 ]] && result="TIMED OUT ($(timeout_var "$name")); $result"
    printf '%-26s %6s %8s  %s\n' "$name" "$rc" "$seconds" "$result"
  done < "$RESULTS/stages.tsv"
  # The failed and erroring cases, from pytest's short summary (-rfE), at most 40 lines.
  cat "$RESULTS"/*.log 2>/dev/null | grep -E "^(FAILED|ERROR) " | head -40
}

status=()
run() {  # run NAME COMMAND...: tee the log into $RESULTS, record the exit status and seconds, rewrite the summary
  local name=$1; shift
  local start=$SECONDS
  echo "=== $name: $*" | tee "$RESULTS/$name.log"
  "$@" 2>&1 | tee -a "$RESULTS/$name.log" | tail -25
  local rc=${PIPESTATUS[0]}
  status+=("$name=$rc")
  { grep -v -P "^$name\t" "$RESULTS/stages.tsv" 2>/dev/null; printf '%s\t%s\t%s\n' "$name" "$rc" $((SECONDS - start)); } \
    > "$RESULTS/stages.tsv.new" && mv "$RESULTS/stages.tsv.new" "$RESULTS/stages.tsv"
  summary > "$RESULTS/summary.txt"
}

pytest_stage() {  # pytest_stage NAME PYTEST_ARGS...: a pytest run with its junit xml and slowest durations
  local name=$1; shift
  local var
  var=$(timeout_var "$name")
  run "$name" timeout -s INT -k 30 "${!var:-1800}" python3 -m pytest -q -p no:cacheprovider -rfE \
    --junitxml="$RESULTS/$name.xml" --durations=40 "$@"
}

# The environment (an offline host's wheels: benchmarks/device_env.sh), then the GPU and version lines.
env_rc=0
{
  if [[ -n $ENV_SCRIPT ]]; then source "$ENV_SCRIPT" || env_rc=1; fi
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" || env_rc=1
} > "$RESULTS/environment.log" 2>&1
cat "$RESULTS/environment.log"
if ((env_rc)); then
  printf 'environment\t%s\t0\n' "$env_rc" >> "$RESULTS/stages.tsv"
  summary > "$RESULTS/summary.txt"
  exit 1
fi

expanded=()
for stage in "${stages[@]}"; do
  case $stage in
    tests) expanded+=(tests-kernels tests-comm tests-fsdp tests-train tests-kernels-compiled) ;;
    faults) expanded+=(faults-saving faults-other faults-rank) ;;
    *) expanded+=("$stage") ;;
  esac
done
for stage in "${expanded[@]}"; do
  case $stage in
    tests-kernels) pytest_stage "$stage" -m gpu "${TESTS_KERNELS[@]}" ;;
    tests-comm) pytest_stage "$stage" -m gpu "${TESTS_COMM[@]}" ;;
    tests-fsdp) pytest_stage "$stage" -m gpu "${TESTS_FSDP[@]}" ;;
    tests-train) pytest_stage "$stage" -m gpu "${TESTS_TRAIN[@]}" ;;
    tests-kernels-compiled) pytest_stage "$stage" -m "not gpu" "${TESTS_KERNELS_COMPILED[@]}" ;;
    # The launcher fault cases (slow and fast) with their ranks on the GPU, in stages that each fit a 600 s command
    # on one H200: a rank killed while saving (4 schemes, 3 launches each); the stalled rank, the resumes and QSDP
    # off and on; one rank's exception and the recipe error.
    faults-saving) QSDP_FAULT_OVERRIDES="device=gpu" pytest_stage "$stage" -m "slow or not slow" \
      "${LAUNCHER_FAULTS[@]}" -k "killed_while_saving" ;;
    faults-other) QSDP_FAULT_OVERRIDES="device=gpu" pytest_stage "$stage" -m "slow or not slow" \
      "${LAUNCHER_FAULTS[@]}" -k "not killed_while_saving" ;;
    faults-rank) QSDP_FAULT_OVERRIDES="device=gpu" pytest_stage "$stage" -m "slow or not slow" "${RANK_FAULTS[@]}" ;;
    sweep) run bench_kernels_sweep timeout 100 python3 benchmarks/bench_kernels.py --sweep --out-dir "$RESULTS" ;;
    kernels)
      run bench_kernels timeout 170 python3 benchmarks/bench_kernels.py --out-dir "$RESULTS"
      run bench_symmetric_hadamard timeout 110 python3 benchmarks/bench_symmetric_hadamard.py --out-dir "$RESULTS"
      run bench_sign timeout 90 python3 benchmarks/bench_sign.py --out-dir "$RESULTS" ;;
    sign) run bench_sign timeout 90 python3 benchmarks/bench_sign.py --out-dir "$RESULTS" ;;
    learned) run bench_kernels_learned timeout 150 python3 benchmarks/bench_kernels.py --learned --out-dir "$RESULTS" ;;
    collectives)
      run bench_collectives_nvlink timeout 240 python3 benchmarks/bench_collectives.py --out-dir "$RESULTS"
      run bench_collectives_socket env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo \
        timeout 300 python3 benchmarks/bench_collectives.py --out-dir "$RESULTS" ;;
  esac
done
echo "stage status: ${status[*]}"
echo "results in $RESULTS; the summary:"
cat "$RESULTS/summary.txt"
[[ " ${status[*]} " != *=[1-9]* ]]  # the exit status: 0 when every stage of this call passed, else 1
