#!/usr/bin/env bash
# One device lease kept busy from its first call: GPU-suite chains and convergence drivers start in the background,
# later calls wait and report, the last packs everything into $OUT as three files (a device call returns at most
# eight). The machine is given back 30 s after a call returns, so make the calls back to back:
#
#   GIT_REV=<sha> bash benchmarks/device_lease.sh start 0:tests-kernels,tests-comm 1:tests-fsdp \
#       -- --arms baseline w8g8 --steps 600 ... -- gpus=2,3 --model 350m --arms baseline ...
#                                                    # suite chains (GPU:stage,...), then each driver's arguments
#                                                    # (a leading gpus=LIST: that driver sees only those GPUs)
#   bash benchmarks/device_lease.sh wait 540         # sleep (at most 570 s), then the status; packs too
#   bash benchmarks/device_lease.sh collect          # the status, packed into $OUT
#
# Each suite chain sees only its GPU (CUDA_VISIBLE_DEVICES), so its multi-rank cases share one GPU over gloo, as on
# a one-GPU machine; several chains may name the same GPU. Each convergence driver (one per group of arguments
# after a --; its --max-ranks counts its own processes only) sees every GPU, or those of a leading
# gpus=LIST, and writes under /tmp/lease/conv-N.
# What comes back: $OUT/lease_status.txt (every progress report), $OUT/suite.tar.xz (every chain's work folder:
# logs, junit xml, durations, summaries) and $OUT/conv.tar.xz (each driver's collected results and log).
set -uo pipefail
LEASE=${LEASE_DIR:-/tmp/lease}
# The environment (wheels, PYTHONPATH): device_env.sh, or the script $SUITE_ENV names, as for run_device_suite.sh.
ENV_SCRIPT=${SUITE_ENV:-benchmarks/device_env.sh}
DEST=${OUT:-/tmp/out}
mkdir -p "$LEASE" "$DEST"

drivers() { compgen -G "$LEASE/conv-*.args" | sed 's|.*/conv-\([0-9]*\)\.args|\1|' | sort -n; }

driver_gpus() { cat "$LEASE/conv-$1.gpus" 2>/dev/null || echo all; }  # driver $1's gpus=LIST, or "all"

visible_gpus() {  # run the rest of the line with driver $1's GPUs, or every GPU
  local gpus
  gpus=$(driver_gpus "$1")
  shift
  if [[ $gpus == all ]]; then "$@"; else CUDA_VISIBLE_DEVICES=$gpus "$@"; fi
}

report() {  # every progress report: each suite chain's stage summary, each driver's arm table
  echo "lease status, $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader
  for summary in "$LEASE"/suite-out-*/device_suite_summary.txt; do
    [[ -f $summary ]] && { echo "--- ${summary%/device_suite_summary.txt}"; cat "$summary"; }
  done
  for log in "$LEASE"/suite-*.out; do
    [[ -f $log ]] && { echo "--- $log (last lines)"; tail -3 "$log"; }
  done
  for driver in $(drivers); do
    mapfile -t args < "$LEASE/conv-$driver.args"
    echo "--- convergence driver $driver (GPUs: $(driver_gpus "$driver"))"
    visible_gpus "$driver" env -u OUT python3 benchmarks/convergence.py "${args[@]}" --out-dir "$LEASE/conv-$driver" \
      --collect "$LEASE/conv-$driver-collected" 2>&1 | tail -40
  done
}

later_call_env() {  # the wheels' environment, and the revision given to start (the reports re-collect records)
  source "$ENV_SCRIPT" > /dev/null 2>&1
  GIT_REV=$(cat "$LEASE/git_rev" 2>/dev/null || echo "${GIT_REV:-}") && export GIT_REV
}

pack() {  # three files into $OUT, each written aside and renamed: never half an archive
  local started=$SECONDS
  report > "$LEASE/lease_status.txt" 2>&1
  cp "$LEASE/lease_status.txt" "$DEST/lease_status.txt"
  compgen -G "$LEASE/suite-*" > /dev/null && (cd "$LEASE" && tar -cJf "$DEST/.suite.tar.xz" suite-* environment.log) \
    && mv "$DEST/.suite.tar.xz" "$DEST/suite.tar.xz"
  compgen -G "$LEASE/conv-*-collected" > /dev/null \
    && (cd "$LEASE" && tar -cJf "$DEST/.conv.tar.xz" conv-*-collected conv-*.log) \
    && mv "$DEST/.conv.tar.xz" "$DEST/conv.tar.xz"
  echo $((SECONDS - started)) > "$LEASE/pack_s"
  cat "$LEASE/lease_status.txt"
}

case ${1:-} in
  start)
    shift
    : "${GIT_REV:?set GIT_REV to the commit under test}"
    export GIT_REV
    echo "$GIT_REV" > "$LEASE/git_rev"  # later calls' reports re-collect the records: the same revision
    # The wheels once, before the chains start (each chain's suite would otherwise install them concurrently).
    source "$ENV_SCRIPT" > "$LEASE/environment.log" 2>&1 || { cat "$LEASE/environment.log"; exit 1; }
    cat "$LEASE/environment.log"
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    chain=0
    while (($#)) && [[ $1 != -- ]]; do
      [[ $1 =~ ^[0-9]+:[a-z,-]+$ ]] || { echo "bad chain '$1': want GPU:stage[,stage...], e.g. 0:tests-kernels"; exit 2; }
      stages=${1#*:}
      CUDA_VISIBLE_DEVICES=${1%%:*} SUITE_WORK=$LEASE/suite-$chain OUT=$LEASE/suite-out-$chain \
        setsid nohup bash benchmarks/run_device_suite.sh ${stages//,/ } > "$LEASE/suite-$chain.out" 2>&1 < /dev/null &
      chain=$((chain + 1))
      shift
    done
    driver=0
    while (($#)); do  # at a --: one driver's arguments follow, up to the next --
      shift
      args=()
      while (($#)) && [[ $1 != -- ]]; do args+=("$1"); shift; done
      ((${#args[@]})) || continue
      # A leading gpus=LIST gives the driver only those GPUs: its 2-rank arms put rank r on its r-th GPU, so two
      # drivers on a 4-GPU machine each take a pair instead of both crowding GPUs 0 and 1.
      gpus=all
      if [[ ${args[0]} == gpus=* ]]; then
        gpus=${args[0]#gpus=}
        [[ $gpus =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "bad '${args[0]}': want gpus=ID[,ID...], e.g. gpus=2,3"; exit 2; }
        args=("${args[@]:1}")
      fi
      printf '%s\n' "${args[@]}" > "$LEASE/conv-$driver.args"
      echo "$gpus" > "$LEASE/conv-$driver.gpus"
      # Without $OUT (here and in report): a driver that finishes would write its record into whichever call's $OUT
      # is current, beside the three packed files, and a call returns at most eight (the rest are left out).
      visible_gpus "$driver" env -u OUT setsid nohup python3 benchmarks/convergence.py "${args[@]}" \
        --out-dir "$LEASE/conv-$driver" > "$LEASE/conv-$driver.log" 2>&1 < /dev/null &
      driver=$((driver + 1))
    done
    sleep "${LEASE_SETTLE_S:-45}"  # long enough for the first launches to show in the report
    pack
    ;;
  wait)
    seconds=${2:-540}
    ((seconds <= 570)) || { echo "wait at most 570 s (one device command is 600 s)"; exit 2; }
    later_call_env
    # The pack after the sleep takes as long as the last one (about 100 s with four drivers): sleep less, so that
    # the call ends within the device's 600 s.
    packing=$(cat "$LEASE/pack_s" 2>/dev/null || echo 0)
    ((seconds + packing <= 570)) || { seconds=$((570 - packing)); echo "sleeping ${seconds} s: a pack takes ${packing} s"; }
    sleep "$((seconds > 0 ? seconds : 0))"
    pack
    ;;
  collect)
    later_call_env
    pack
    ;;
  *) echo "usage: device_lease.sh start [GPU:stage,...] [-- DRIVER_ARGS]... | wait SECONDS | collect"; exit 2 ;;
esac
