#!/usr/bin/env bash
# One-command setup: a virtual environment in .venv with composer_qsdp installed in editable mode, its test
# extras (which include the recipes', the demo's and the Hugging Face model's), and the pinned GPU-machine stack of overrides.txt
# (see there for why Composer's pins are lifted).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip uv
"$VENV/bin/python" -m uv pip install --python "$VENV/bin/python" \
    --override "$ROOT/overrides.txt" -e "$ROOT[test]"
"$VENV/bin/python" -c "import torch, composer, streaming, triton, composer_qsdp; print('composer_qsdp ready: torch', torch.__version__, 'composer', composer.__version__)"
