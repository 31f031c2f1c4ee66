#!/usr/bin/env bash
# The GPU side of the test suite and the kernel/collective benchmarks, staged so each stage fits one 10-minute
# device command. Run from the repository root of a GPU machine; with fewer GPUs than a test's ranks, the ranks
# share the GPUs over gloo (tests/dist_spawn.py, the shared_gpu key), so one GPU runs every multi-rank case; NCCL
# runs where there is a GPU per rank. The collectives stage needs 2+ GPUs (NCCL):
#   GIT_REV=<short sha> OUT=<dir> bash benchmarks/run_device_suite.sh tests-kernels     # one stage per device call
#   GIT_REV=<short sha> OUT=<dir> bash benchmarks/run_device_suite.sh tests kernels     # several in one call
# Stages (benchmarks/README.md, "The device suite", says how long each takes and how to chain device calls):
#   tests-kernels tests-comm tests-fsdp tests-train   the GPU-marked tests (pytest -m gpu) in four parts; tests = all
#   faults-saving faults-other                        the launcher fault cases, ranks on the GPU; faults = both
#   kernels sign learned sweep                        kernel benchmark tables
#   collectives                                       NVLink and emulated-socket collective tables (2+ GPUs)
# A pytest stage NAME stops after ${NAME}_TIMEOUT_S seconds (upper case, '-' as '_', e.g. TESTS_COMM_TIMEOUT_S;
# default 520) with SIGINT, so that pytest still writes its junit xml and its slowest durations (SIGKILL 30 s later):
# with the wheel install and the packing, one stage fits one 600 s device command.
#
# Every stage writes its log (and a pytest stage its junit xml and --durations=40 table) into $SUITE_WORK (default
# /tmp/device_suite-$GIT_REV), which survives between device calls while the machine stays warm. After each stage
# the whole of $SUITE_WORK is packed into $OUT/device_suite.tar.xz, with $OUT/device_suite_summary.txt (each
# stage's exit status, seconds and pytest result line) beside it: two files, whatever a device call brings back,
# and the archive of the last call holds every stage run on that machine at this revision. The script's own exit
# status is 0 when every stage of this call passed, 1 otherwise (2 for a misspelt stage).
set -uo pipefail
: "${GIT_REV:?set GIT_REV to the commit under test}"
DEST=${OUT:-/tmp/out}
WORK=${SUITE_WORK:-/tmp/device_suite-$GIT_REV}
mkdir -p "$DEST" "$WORK"
# The benchmark drivers write their tables into $OUT: into the work folder, so they are packed with the logs.
export OUT=$WORK

TESTS_KERNELS=(tests/quant tests/kernels)
TESTS_COMM=(tests/comm tests/schemes tests/config tests/engine tests/auto tests/optim)
TESTS_FSDP=(tests/fsdp2 tests/fsdp1 tests/ddp)
TESTS_TRAIN=(tests/algorithms tests/recipes/models tests/test_train.py tests/test_shared_gpu.py)
FAULTS=(tests/faults/test_launcher_faults.py tests/faults/test_rank_exception.py)
STAGES="tests tests-kernels tests-comm tests-fsdp tests-train faults faults-saving faults-other"
STAGES+=" kernels sign learned sweep collectives"

timeout_var() { tr '[:lower:]-' '[:upper:]_' <<< "${1}_TIMEOUT_S"; }  # the timeout variable of stage $1

summary() {  # one line per stage run into $WORK so far: name, exit status, seconds, pytest's result line
  echo "device suite, git $GIT_REV, $(hostname), $(date -u +%FT%TZ)"
  grep -m4 -E "^[0-9]+, |^torch " "$WORK/environment.log" 2>/dev/null
  printf '%-22s %6s %8s  %s\n' stage status seconds result
  [[ -f $WORK/stages.tsv ]] && while IFS=$'\t' read -r name rc seconds; do
    local result
    result=$(grep -E "[0-9]+ (passed|failed|error|errors|skipped|deselected)|no tests ran|Interrupted" \
      "$WORK/$name.log" 2>/dev/null | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')
    [[ $rc == 124 || $rc == 137 ]] && result="TIMED OUT ($(timeout_var "$name")); $result"
    printf '%-22s %6s %8s  %s\n' "$name" "$rc" "$seconds" "$result"
  done < "$WORK/stages.tsv"
  # The failed and erroring cases, from pytest's short summary (-rfE), at most 40 lines.
  cat "$WORK"/*.log 2>/dev/null | grep -E "^(FAILED|ERROR) " | head -40
}

pack() {  # the summary and one archive of $WORK into $DEST (written aside, then renamed: never half an archive)
  summary > "$WORK/summary.txt"
  cp "$WORK/summary.txt" "$DEST/device_suite_summary.txt"
  tar -C "$(dirname "$WORK")" -cJf "$DEST/.device_suite.tar.xz" "$(basename "$WORK")" \
    && mv "$DEST/.device_suite.tar.xz" "$DEST/device_suite.tar.xz"
}

status=()
run() {  # run NAME COMMAND...: tee the log into $WORK, record the exit status and seconds, pack
  local name=$1; shift
  local start=$SECONDS
  echo "=== $name: $*" | tee "$WORK/$name.log"
  "$@" 2>&1 | tee -a "$WORK/$name.log" | tail -25
  local rc=${PIPESTATUS[0]}
  status+=("$name=$rc")
  # One line per stage: a stage run again in the same warm session replaces its earlier line.
  { grep -v -P "^$name\t" "$WORK/stages.tsv" 2>/dev/null; printf '%s\t%s\t%s\n' "$name" "$rc" $((SECONDS - start)); } \
    > "$WORK/stages.tsv.new" && mv "$WORK/stages.tsv.new" "$WORK/stages.tsv"
  pack
}

pytest_stage() {  # pytest_stage NAME PYTEST_ARGS...: a pytest run with its junit xml and slowest durations
  local name=$1; shift
  local var
  var=$(timeout_var "$name")
  run "$name" timeout -s INT -k 30 "${!var:-520}" python3 -m pytest -q -p no:cacheprovider -rfE \
    --junitxml="$WORK/$name.xml" --durations=40 "$@"
}

for stage in "$@"; do  # refuse a misspelt stage before the environment is set up
  [[ " $STAGES " == *" $stage "* ]] || { echo "unknown stage '$stage'; allowed: $STAGES"; exit 2; }
done
[[ $# -gt 0 ]] || { echo "name at least one stage; allowed: $STAGES"; exit 2; }

# Wheel install, GPU and version lines, kept for the summary: benchmarks/device_env.sh, or the script $SUITE_ENV
# names (a machine whose environment is prepared otherwise; the CPU test of this script).
source "${SUITE_ENV:-$(dirname "$0")/device_env.sh}" > "$WORK/environment.log" 2>&1
env_rc=$?
cat "$WORK/environment.log"
if ((env_rc)); then printf 'environment\t%s\t0\n' "$env_rc" >> "$WORK/stages.tsv"; pack; exit 1; fi

expanded=()
for stage in "$@"; do
  case $stage in
    tests) expanded+=(tests-kernels tests-comm tests-fsdp tests-train) ;;
    faults) expanded+=(faults-saving faults-other) ;;
    *) expanded+=("$stage") ;;
  esac
done
for stage in "${expanded[@]}"; do
  case $stage in
    tests-kernels) pytest_stage "$stage" -m gpu "${TESTS_KERNELS[@]}" ;;
    tests-comm) pytest_stage "$stage" -m gpu "${TESTS_COMM[@]}" ;;
    tests-fsdp) pytest_stage "$stage" -m gpu "${TESTS_FSDP[@]}" ;;
    tests-train) pytest_stage "$stage" -m gpu "${TESTS_TRAIN[@]}" ;;
    # The launcher fault cases (slow and fast) with their ranks on the GPU: a rank killed while saving (4 schemes,
    # 3 launches each), then the stalled rank, the resumes and the rank exception.
    faults-saving) QSDP_FAULT_OVERRIDES="device=gpu" pytest_stage "$stage" -m "slow or not slow" "${FAULTS[@]}" \
      -k "killed_while_saving" ;;
    faults-other) QSDP_FAULT_OVERRIDES="device=gpu" pytest_stage "$stage" -m "slow or not slow" "${FAULTS[@]}" \
      -k "not killed_while_saving" ;;
    sweep) run bench_kernels_sweep timeout 100 python3 benchmarks/bench_kernels.py --sweep ;;
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
  esac
done
echo "stage status: ${status[*]}"
echo "packed: $DEST/device_suite.tar.xz ($(du -h "$DEST/device_suite.tar.xz" | cut -f1)), and the summary:"
cat "$DEST/device_suite_summary.txt"
[[ " ${status[*]} " != *=[1-9]* ]]  # the exit status: 0 when every stage of this call passed, else 1
