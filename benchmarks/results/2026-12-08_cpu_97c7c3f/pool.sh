# Run from the repository root on any machine (CPU, under a second):
#   bash benchmarks/results/2026-12-08_cpu_97c7c3f/pool.sh
# Each cell's newest combined convergence record (and, for GPT-125M pysource, the record that holds its
# qwd-w3g3-loco seeds); the GPT-350M prose cell ran qwd-w3g3-loco with speculative_update (its -ahead arm).
set -euo pipefail
R=benchmarks/results
D=$R/2026-12-08_cpu_97c7c3f
N125=convergence-gpt-125m-t512-b32-s2000-combined.json
N350=convergence-gpt-350m-t512-b32-s1000-combined.json
python3 benchmarks/pooled_gaps.py --arms w8g8 w8g4 qwd-w3g3-loco tlq-hs-2x2 sdp4bit-2x2 zeropp-2x2 w8g4-paper \
  --cell 125m-pysource $R/2026-12-01_h200_c526aae/train-loss/pysource-125m/$N125 $R/2026-12-07_h100_bf91a54/pysource-125m/$N125 \
  --cell 125m-csource $R/2026-12-08_h100_bdd76a2/csource-125m/$N125 \
  --cell 125m-prose $R/2026-12-06_h100_b5bf5bf/prose-125m/$N125 \
  --cell 350m-pysource $R/2026-12-03_h200_0de83cd/pysource-350m/$N350 \
  --cell 350m-csource $R/2026-12-03_h200_9a56bd2/csource-350m/$N350 \
  --cell 350m-prose $R/2026-12-02_h200_05db038/prose-350m/$N350 \
  --alias qwd-w3g3-loco-ahead=qwd-w3g3-loco --out-dir $D
