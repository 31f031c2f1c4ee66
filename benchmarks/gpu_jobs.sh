#!/usr/bin/env bash
# GPU test stages and convergence drivers as background jobs on one GPU host, all writing into one results folder:
#
#   bash benchmarks/gpu_jobs.sh start --results DIR [--env FILE] 0:tests-kernels,tests-comm 1:tests-fsdp \
#       -- --arms baseline w8g8 --steps 600 ... -- gpus=2,3 --model 350m --arms baseline ...
#                                      # suite chains (GPU:stage,...), then each driver's arguments after a --
#                                      # (a leading gpus=LIST: that driver sees only those GPUs)
#   bash benchmarks/gpu_jobs.sh status --results DIR                    # progress of every job, now
#   bash benchmarks/gpu_jobs.sh wait --results DIR [--timeout SECONDS]  # until every job ended, then the status
#   bash benchmarks/gpu_jobs.sh collect --results DIR [--archive FILE]  # the status, and DIR packed into FILE
#
# Each suite chain runs benchmarks/gpu_suite.sh with only its GPU visible (CUDA_VISIBLE_DEVICES), so its multi-rank
# cases share that GPU over gloo, as on a one-GPU host; several chains may name the same GPU. Each convergence
# driver (benchmarks/convergence.py; one per group of arguments after a --, its --max-ranks counting its own
# processes only) sees every GPU, or those of a leading gpus=LIST. The jobs are detached: they outlive the shell
# that started them, and any later shell on the host can ask for their status.
#
# The results folder: suite-N/ (chain N's logs, junit xml, durations and summary.txt) and suite-N.log (its
# console), conv-N/ (driver N's results as its --collect copies them: the tables, progress.json,
# arms-logs.tar.gz) and conv-N.log, status.txt (the last status), environment.log, and work/ (the drivers'
# --out-dir: checkpoints and launches, left out of --archive) and jobs/ (what later commands need: each job's
# process id and arguments, the revision and environment script given to start).
# Exit status: 0; wait: 3 when jobs still run at its timeout; 2 for a malformed argument.
set -uo pipefail

usage() {
  echo "usage: gpu_jobs.sh start --results DIR [--env FILE] [GPU:stage,...]... [-- [gpus=LIST] DRIVER_ARGS...]..."
  echo "       gpu_jobs.sh status|wait|collect --results DIR [--timeout SECONDS] [--archive FILE]"
}

command=${1:-}
shift || true
RESULTS= ENV_SCRIPT= TIMEOUT= ARCHIVE=
rest=()
while (($#)); do
  case $1 in
    --results | --env | --timeout | --archive)
      (($# >= 2)) || { echo "$1 needs a value"; usage; exit 2; }
      case $1 in --results) RESULTS=$2 ;; --env) ENV_SCRIPT=$2 ;; --timeout) TIMEOUT=$2 ;; --archive) ARCHIVE=$2 ;; esac
      shift 2 ;;
    --) rest+=("$@"); break ;;  # the drivers' arguments are theirs, whatever they look like
    *) rest+=("$1"); shift ;;
  esac
done
[[ -n $RESULTS ]] || { echo "name the results folder: --results DIR"; usage; exit 2; }
[[ -z $TIMEOUT || $TIMEOUT =~ ^[0-9]+$ ]] || { echo "bad --timeout '$TIMEOUT': want whole seconds"; exit 2; }
mkdir -p "$RESULTS/jobs" "$RESULTS/work"
RESULTS=$(cd "$RESULTS" && pwd)
JOBS=$RESULTS/jobs

drivers() { compgen -G "$JOBS/conv-*.args" | sed 's|.*/conv-\([0-9]*\)\.args|\1|' | sort -n; }

driver_gpus() { cat "$JOBS/conv-$1.gpus" 2>/dev/null || echo all; }  # driver $1's gpus=LIST, or "all"

visible_gpus() {  # run the rest of the line with driver $1's GPUs, or every GPU
  local gpus
  gpus=$(driver_gpus "$1")
  shift
  if [[ $gpus == all ]]; then "$@"; else CUDA_VISIBLE_DEVICES=$gpus "$@"; fi
}

running() { kill -0 "$(cat "$1" 2>/dev/null || echo 0)" 2>/dev/null; }  # whether the job of pid file $1 runs

state() { if running "$1"; then echo running; else echo ended; fi; }

jobs_running() {  # how many jobs still run
  local n=0 pid
  for pid in "$JOBS"/*.pid; do [[ -f $pid ]] && running "$pid" && n=$((n + 1)); done
  echo "$n"
}

report() {  # every job's progress: each chain's stage summary, each driver's arm table (also collected)
  echo "GPU jobs in $RESULTS, $(date -u +%FT%TZ), $(jobs_running) running"
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader 2>/dev/null
  local chain driver
  for chain in $(compgen -G "$JOBS/suite-*.pid" | sed 's|.*/suite-\([0-9]*\)\.pid|\1|' | sort -n); do
    echo "--- suite chain $chain ($(state "$JOBS/suite-$chain.pid"))"
    cat "$RESULTS/suite-$chain/summary.txt" 2>/dev/null
    tail -3 "$RESULTS/suite-$chain.log" 2>/dev/null
  done
  for driver in $(drivers); do
    mapfile -t args < "$JOBS/conv-$driver.args"
    echo "--- convergence driver $driver (GPUs: $(driver_gpus "$driver"); $(state "$JOBS/conv-$driver.pid"))"
    visible_gpus "$driver" python3 benchmarks/convergence.py "${args[@]}" --out-dir "$RESULTS/work/conv-$driver" \
      --collect "$RESULTS/conv-$driver" 2>&1 | tail -40
  done
}

later_env() {  # the environment and revision given to start (the reports re-collect the drivers' records)
  local env_script
  env_script=$(cat "$JOBS/env" 2>/dev/null)
  if [[ -n $env_script ]]; then source "$env_script" > /dev/null 2>&1; fi
  GIT_REV=$(cat "$JOBS/git_rev" 2>/dev/null || echo "${GIT_REV:-}") && export GIT_REV
}

status() {  # the report into status.txt (written aside, then renamed) and on the console
  report > "$RESULTS/.status.txt" 2>&1
  mv "$RESULTS/.status.txt" "$RESULTS/status.txt"
  cat "$RESULTS/status.txt"
}

case $command in
  start)
    set -- "${rest[@]}"
    if compgen -G "$JOBS/*.pid" > /dev/null; then
      echo "$RESULTS already holds jobs: give each start its own results folder"; exit 2
    fi
    for arg in "$@"; do  # refuse a malformed chain before anything starts
      [[ $arg == -- ]] && break
      [[ $arg =~ ^[0-9]+:[a-z,-]+$ ]] || { echo "bad chain '$arg': want GPU:stage[,stage...], e.g. 0:tests-kernels"; exit 2; }
    done
    GIT_REV=${GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo)} && export GIT_REV
    echo "$GIT_REV" > "$JOBS/git_rev"
    env_path=
    if [[ -n $ENV_SCRIPT ]]; then env_path=$(cd "$(dirname "$ENV_SCRIPT")" && pwd)/$(basename "$ENV_SCRIPT"); fi
    echo "$env_path" > "$JOBS/env"
    # The environment once, before the chains start (each chain's suite would otherwise install wheels at once).
    if [[ -n $env_path ]]; then
      source "$env_path" > "$RESULTS/environment.log" 2>&1 || { cat "$RESULTS/environment.log"; exit 1; }
      cat "$RESULTS/environment.log"
    fi
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    chain=0
    while (($#)) && [[ $1 != -- ]]; do
      stages=${1#*:}
      CUDA_VISIBLE_DEVICES=${1%%:*} setsid nohup bash benchmarks/gpu_suite.sh --results "$RESULTS/suite-$chain" \
        ${env_path:+--env "$env_path"} ${stages//,/ } > "$RESULTS/suite-$chain.log" 2>&1 < /dev/null &
      echo $! > "$JOBS/suite-$chain.pid"
      echo "started suite chain $chain on GPU ${1%%:*}: ${stages//,/ }"
      chain=$((chain + 1))
      shift
    done
    driver=0
    while (($#)); do  # at a --: one driver's arguments follow, up to the next --
      shift
      args=()
      while (($#)) && [[ $1 != -- ]]; do args+=("$1"); shift; done
      ((${#args[@]})) || continue
      # A leading gpus=LIST gives the driver only those GPUs: a driver spreads its own arms over the GPUs it sees
      # but knows nothing of another driver's, so two drivers on a 4-GPU host each take a pair instead of both
      # starting on GPUs 0 and 1.
      gpus=all
      if [[ ${args[0]} == gpus=* ]]; then
        gpus=${args[0]#gpus=}
        [[ $gpus =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "bad '${args[0]}': want gpus=ID[,ID...], e.g. gpus=2,3"; exit 2; }
        args=("${args[@]:1}")
      fi
      printf '%s\n' "${args[@]}" > "$JOBS/conv-$driver.args"
      echo "$gpus" > "$JOBS/conv-$driver.gpus"
      visible_gpus "$driver" setsid nohup python3 benchmarks/convergence.py "${args[@]}" \
        --out-dir "$RESULTS/work/conv-$driver" > "$RESULTS/conv-$driver.log" 2>&1 < /dev/null &
      echo $! > "$JOBS/conv-$driver.pid"
      echo "started convergence driver $driver (GPUs: $gpus): ${args[*]}"
      driver=$((driver + 1))
    done
    ;;
  status)
    later_env
    status
    ;;
  wait)
    later_env
    started=$SECONDS
    while (($(jobs_running))) && [[ -z $TIMEOUT || $((SECONDS - started)) -lt $TIMEOUT ]]; do
      sleep "${GPU_JOBS_POLL_S:-30}"
    done
    status
    (($(jobs_running) == 0)) || exit 3
    ;;
  collect)
    later_env
    status
    if [[ -n $ARCHIVE ]]; then
      mkdir -p "$(dirname "$ARCHIVE")"
      archive=$(cd "$(dirname "$ARCHIVE")" && pwd)/$(basename "$ARCHIVE")
      # Written aside, then renamed: a reader never finds half an archive.
      tar -C "$(dirname "$RESULTS")" --exclude="$(basename "$RESULTS")/work" -cJf "$archive.tmp" \
        "$(basename "$RESULTS")" && mv "$archive.tmp" "$archive" && echo "packed: $archive ($(du -h "$archive" | cut -f1))"
    fi
    ;;
  *) usage; exit 2 ;;
esac
