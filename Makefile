# The README main job: build the bundled-Wikipedia shards if missing, then train the tiny GPT with QSDP W8G8 on
# 2 CPU processes through Composer's launcher (a few minutes on 2 cores). `make demo-baseline` runs plain FSDP2.
PYTHON ?= .venv/bin/python
COMPOSER ?= .venv/bin/composer
WIKI_SHARDS := data/wiki-gpt2-t64

.PHONY: demo demo-baseline notebook try wiki-shards

demo: wiki-shards
	OMP_NUM_THREADS=1 $(COMPOSER) -n 2 -m composer_qsdp.recipes.train yamls/cpu/gpt-tiny-qsdp.yaml

demo-baseline: wiki-shards
	OMP_NUM_THREADS=1 $(COMPOSER) -n 2 -m composer_qsdp.recipes.train yamls/cpu/gpt-tiny-baseline.yaml

wiki-shards:
	$(PYTHON) -m composer_qsdp.recipes.data.build wikipedia $(WIKI_SHARDS) --seq-len 64 --skip-existing

# Try any GPT recipe of yamls/ (the GPU ones included) on 2 CPU processes over gloo in a few minutes: its algorithm,
# optimizer and parallelism on a 2-layer GPT of width 128 and the bundled Wikipedia sample, 30 steps, no checkpoints
# (yamls/cpu/try-out.overrides says what it changes). Metrics: runs/try/<the recipe's run_name>/metrics.json.
RECIPE ?= yamls/gpt-125m/qsdp-w8g8.yaml

try: wiki-shards
	OMP_NUM_THREADS=1 $(COMPOSER) -n 2 -m composer_qsdp.recipes.train $(RECIPE) @yamls/cpu/try-out.overrides

# Re-run the demo notebook top to bottom and write the executed copy, with its outputs and plots, to NOTEBOOK_OUT
# (about 10 minutes on 2 cores); the tracked notebook is left as it is. Copy NOTEBOOK_OUT over
# notebooks/qsdp_demo.ipynb to refresh the committed outputs.
NOTEBOOK_OUT ?= runs/notebook/qsdp_demo.ipynb

notebook: wiki-shards
	$(PYTHON) tools/execute_notebook.py notebooks/qsdp_demo.ipynb --out $(NOTEBOOK_OUT)
