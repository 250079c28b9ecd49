#!/usr/bin/env bash
# The GPU measurements (README, "Scale out"), in one go on a machine with one CUDA GPU, in the project's root:
#
#   benchmarks/gpu_session.sh OUT [key=value ...]
#
# 1. the tests (pytest, as `make test` runs them; the CUDA-marked ones run here) -> OUT/tests.log
# 2. the default pipeline, `dvc repro`, timed -> metrics/gpu/default.json (benchmarks/gpu_report.py: wall time,
#    training questions/s, MFU against this GPU's bf16 matmul peak, test accuracy), OUT/default.tgz (metrics/,
#    dvc.lock and the repro log)
# 3. the GPU recipe (recipes/gpu.yaml, then the key=value arguments over it, e.g. a smaller num_images to fit
#    a time budget) written into params.yaml and `dvc repro` again -> metrics/gpu/recipe.json, OUT/recipe.tgz
#
# Each part has a time limit in seconds, so that a lease's end still leaves the parts before it: TESTS_S (0: no
# tests; TESTS_ARGS selects them, e.g. "-k cuda"), DEFAULT_S, RECIPE_S (by default what is left of DEADLINE
# seconds after the script's start, less the report's time). It edits params.yaml and rewrites metrics/ and
# dvc.lock: run it in a copy of the project.
# Where the project is no git repository (a copied working tree), DVC runs without one (core.no_scm).
set -u
out=${1:?usage: benchmarks/gpu_session.sh OUT [key=value ...]}
shift
mkdir -p "$out" metrics/gpu
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
stamp() { while IFS= read -r line; do printf '[%s] %s\n' "$(date +%T)" "$line"; done; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || dvc config --local core.no_scm true

if [ "${TESTS_S:-150}" != 0 ]; then  # TESTS_S=0: no tests
  echo "== tests"
  # TESTS_ARGS unquoted: its words are pytest arguments
  timeout "${TESTS_S:-150}" python -m pytest -v --tb=short -n "${TEST_WORKERS:-12}" --dist loadgroup \
    -p no:cacheprovider ${TESTS_ARGS:-} > "$out/tests.log" 2>&1
  echo "pytest exit $?"; grep -E "FAILED|ERROR" "$out/tests.log" | head -n 30; tail -n 3 "$out/tests.log"
fi

repro() {  # $1: the run's name; the pipeline timed, then its report
  local started wall
  started=$(date +%s.%N)
  timeout "$2" dvc repro 2>&1 | stamp > "$out/$1_repro.log"
  local status=${PIPESTATUS[0]}
  wall=$(python -c "print(round($(date +%s.%N) - $started, 1))")
  grep -E "Running stage|ERROR|rror:" "$out/$1_repro.log" | head -n 40
  echo "dvc repro exit $status after $wall s"
  if [ "$status" = 0 ]; then
    python benchmarks/gpu_report.py --name "$1" --wall-s "$wall" --out "metrics/gpu/$1.json" | tail -n 40
  fi
  cp dvc.lock "$out/$1_dvc.lock"
  tar czf "$out/$1.tgz" metrics dvclive "$out/$1_repro.log" "$out/$1_dvc.lock" 2>/dev/null
  rm -f "$out/$1_dvc.lock" "$out/$1_repro.log"
}

echo "== default pipeline"
repro default "${DEFAULT_S:-360}"  # on an H200 the stages up to counterfactuals took 210 s

echo "== GPU recipe"
python - "$@" <<'EOF' || exit 1
import sys
import yaml
from vlm.recipe import overrides

params = yaml.safe_load(open("params.yaml"))
values = overrides(yaml.safe_load(open("recipes/gpu.yaml")), params, "recipes/gpu.yaml")
values |= {key: yaml.safe_load(text) for key, _, text in (item.partition("=") for item in sys.argv[1:])}
for key, value in values.items():
    *path, last = key.split(".")
    section = params
    for name in path:
        section = section.get(name, {})
    if last not in section:
        sys.exit(f"{key}: not a key of params.yaml")
    section[last] = value
    print(f"  {key} = {value}")
open("params.yaml", "w").write(yaml.safe_dump(params, sort_keys=False))
EOF
repro recipe "${RECIPE_S:-$(( ${DEADLINE:-100000} - SECONDS - 45 ))}"
