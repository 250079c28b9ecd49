# Two entry points for a fresh machine (see README):
#   make repro   create .venv, install pinned deps, run the whole DVC pipeline
#   make test    create .venv, install pinned deps (+ test extras), lint (ruff, duplicate code), run the tests
#   make scaling the accuracy-vs-compute curve (queued experiments, hours)
#   make holdout the gap on a held-out combination of frame attributes (a queued experiment)
#   make real ROOT=/path/to/bdd100k_val   the trained models zero-shot on real labelled frames (metrics/real_frames.json)
#   make readme  the result tables of README.md and docs/experiments.md from metrics/
#   make compare the experiments side by side: the test accuracies (VLM, blind) first, then whatever differs
#   make gpu     the GPU recipe (recipes/gpu.yaml) as a dvc exp run: one modern GPU, at most about 15 minutes
#   make memory  peak memory of every stage at 1,000 and 10,000 synthetic images (tens of minutes)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup repro test readme compare gpu bench memory scaling holdout real clean

# A new .venv takes about 6.2 GB (PyTorch's CUDA build is 5.5 GB of it): say so before pip runs out of disk halfway.
VENV_GB := 7
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -c 'import shutil, sys; free = shutil.disk_usage(".").free / 1e9; \
		sys.exit(free < $(VENV_GB) and f"make: a new $(VENV) needs about $(VENV_GB) GB free, {free:.1f} GB here")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	$(BIN)/python -m vlm.plots_page .dvc/tmp/plots_page.html  # dvc plots' page, its scripts inlined: draws offline
	touch $(STAMP)

setup: $(STAMP)

repro: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" dvc repro

# Chromium for the offline plots test (where apt may install it), lint (ruff, config in pyproject.toml) and no
# block of 6+ lines repeated in vlm/ (pylint's duplicate-code),
# then the tests.
test: $(STAMP)
	command -v chromium >/dev/null || apt-get install -y -qq chromium >/dev/null 2>&1 \
		|| (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 \
		|| echo "make: no Chromium (Debian's chromium package): the offline plots test is skipped"
	$(BIN)/ruff check .
	$(BIN)/pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 --score=n vlm
	PATH="$(abspath $(BIN)):$$PATH" python -m pytest -n 2 --dist loadgroup

# Every VLM/blind test accuracy, macro-F1 and ECE column stays (--keep) even where equal; other metrics and params
# show only where the experiments differ (--only-changed); the code and data hash columns go (--drop); best first.
# The result tables of README.md and docs/experiments.md written from metrics/ (vlm/readme.py; a test checks them)
readme: $(STAMP)
	$(BIN)/python -m vlm.readme

compare: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" dvc exp show --only-changed --drop '.*/' --keep '^(vlm|blind|gain_from_vision)\.' \
		--sort-by vlm.accuracy --sort-order desc

# The GPU recipe: params.yaml's values changed by recipes/gpu.yaml, as a dvc exp run (python -m vlm.recipe checks the
# keys, then runs it; add your own flags after it: make gpu EXTRA="-S train.epochs=16"). It stops when torch sees no
# GPU, unless ALLOW_CPU=1.
gpu: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" PYTHONPATH=. python -m vlm.recipe recipes/gpu.yaml --run \
		$(if $(filter 1,$(ALLOW_CPU)),,--needs-cuda) -- $(EXTRA)

bench: $(STAMP)
	PYTHONPATH=. $(BIN)/python benchmarks/bench_tokenizer.py --out metrics/bench_tokenizer.json
	PYTHONPATH=. $(BIN)/python benchmarks/bench_model.py --out metrics/bench_model.json
	PYTHONPATH=. $(BIN)/python benchmarks/bench_loader.py --images data/raw/images --out metrics/bench_pack.json
	PYTHONPATH=. $(BIN)/python benchmarks/bench_train_step.py --data data/processed --out metrics/bench_train_step.json
	PYTHONPATH=. $(BIN)/python benchmarks/recipe_compute.py --out metrics/recipe_compute.json

# Peak RSS per stage (and per DDP rank) at two dataset sizes, each in a throw-away project: what grows with the data.
# Training from HDF5, what runtime.train.in_memory: auto picks when a split does not fit its budget (the in-RAM variants,
# bounded by that budget, are --variants "train" "train (2 ranks)").
memory: $(STAMP)
	PYTHONPATH=. $(BIN)/python benchmarks/bench_memory.py --sizes 1000 10000 \
		--variants "train (HDF5)" "train (2 ranks, HDF5)" --out metrics/bench_memory.json

# The accuracy-vs-compute curve: queued `dvc exp run`s at 1x-8x the default epochs, at 224 px, and at 2x-16x the
# scenes at the default epochs, one at a time (hours on 2 cores; re-running resumes), collected into
# metrics/scaling.json and metrics/plots/scaling.png.
scaling: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" PYTHONPATH=. python benchmarks/scaling_curve.py --image-multiples 2 4 8 16 \
		--targets 0.90 0.95 0.97

# The held-out combination gap: a queued `dvc exp run` whose test split is the rainy nights no split trains on,
# against the workspace's model on the same frames (after make repro), into metrics/holdout.json.
holdout: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" PYTHONPATH=. python benchmarks/holdout_gap.py

# The models of the last make repro zero-shot on a folder of real labelled frames in BDD100K's layout (ROOT): only
# aggregates are written (metrics/real_frames.json); the frames and their labels stay where they are. Then the
# model card (models/README.md) is written again with them.
real: $(STAMP)
	test -n "$(ROOT)" || { echo "make real: set ROOT to a folder of labelled frames in BDD100K's layout"; exit 2; }
	PYTHONPATH=. $(BIN)/python benchmarks/real_frames.py --root "$(ROOT)"
	PATH="$(abspath $(BIN)):$$PATH" dvc repro --single-item model_card

clean:
	rm -rf $(VENV)
