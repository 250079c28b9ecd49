# Two entry points for a fresh machine (see README):
#   make repro   create .venv, install pinned deps, run the whole DVC pipeline
#   make test    create .venv, install pinned deps (+ test extras), run the tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup repro test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

repro: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" dvc repro

test: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" python -m pytest -n 2 --dist loadgroup

bench: $(STAMP)
	PYTHONPATH=. $(BIN)/python benchmarks/bench_tokenizer.py --out metrics/bench_tokenizer.json
	PYTHONPATH=. $(BIN)/python benchmarks/bench_model.py --out metrics/bench_model.json
	PYTHONPATH=. $(BIN)/python benchmarks/bench_loader.py --images data/raw/images --out metrics/bench_pack.json

clean:
	rm -rf $(VENV)
