#!/bin/bash
# usage: run_arm.sh NAME [overrides...]: one arm of the tiny CPU GPT (2 gloo processes), metrics in runs/NAME.json
cd "$(git rev-parse --show-toplevel)"
mkdir -p runs
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
name=$1; shift
.venv/bin/composer -n 2 -m composer_qsdp.train yamls/cpu/gpt-tiny-baseline.yaml run_name=$name metrics_file=runs/$name.json progress_bar=false eval_interval=50ba "$@" > runs/$name.log 2>&1
echo "rc=$?" >> runs/$name.log
