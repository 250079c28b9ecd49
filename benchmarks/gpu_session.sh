#!/usr/bin/env bash
# The GPU measurements (README, "Scale out"), in one go on a machine with one CUDA GPU, in the project's root:
#
#   benchmarks/gpu_session.sh OUT [key=value ...]
#
# 1. the tests (pytest, as `make test` runs them; the CUDA-marked ones run here) -> OUT/tests.log
# 2. the GPU recipe (recipes/gpu.yaml, then the key=value arguments over it, e.g. a smaller num_images to fit
#    a time budget) written into params.yaml, timed -> metrics/gpu/recipe.json, OUT/recipe.tgz (metrics/, dvc.lock
#    and the stamped repro log). First `dvc repro evaluate`, then the report: training questions/s, MFU against this
#    GPU's bf16 matmul peak, test accuracy, each stage's seconds. Then the rest of `dvc repro`, and the whole
#    pipeline's wall time is added to the report. So a time limit that ends the last stages keeps the rest.
# 3. the default pipeline, the same way -> metrics/gpu/default.json, OUT/default.tgz
#
# PARTS picks and orders 2 and 3 (default "recipe default": the recipe's accuracy is what a lease is for, the default
# pipeline gets the time left; "default recipe", "recipe"; "" for none, the tests alone); each starts from the
# params.yaml the script found. Each part has a time limit in whole seconds, so that a lease's end still leaves the
# parts before it: TESTS_S (0: no tests; TESTS_ARGS selects them, e.g. "-k cuda"), DEFAULT_S and RECIPE_S, these two
# cut to what is left of DEADLINE seconds after the script's start, less the report's time. Progress bars print every
# TQDM_MININTERVAL seconds, each update a stamped line of the log. It edits params.yaml and rewrites metrics/ and
# dvc.lock: run it in a copy of the project.
# Where the project is no git repository (a copied working tree), DVC runs without one (core.no_scm).
# Exit status: 1 when the tests, a pipeline part that started or its report failed, or a part ran out of time (each
# part still runs).
set -u
failed=0
out=${1:?usage: benchmarks/gpu_session.sh OUT [key=value ...]}
case "$out" in
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;  # the comment above
  -*) echo "OUT: a folder for the logs, got the option $out (usage: benchmarks/gpu_session.sh OUT [key=value ...])" >&2
      exit 1 ;;
esac
shift
for name in TESTS_S DEFAULT_S RECIPE_S DEADLINE; do  # each a whole number of seconds where set
  [[ ${!name:-0} =~ ^[0-9]+$ ]] || { echo "$name=${!name}: not a whole number of seconds" >&2; exit 1; }
done
mkdir -p -- "$out" metrics/gpu || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_MININTERVAL=${TQDM_MININTERVAL:-5}
stamp() { while IFS= read -r line; do printf '[%s] %s\n' "$(date +%T)" "$line"; done; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || dvc config --local core.no_scm true

if [ "${TESTS_S:-150}" != 0 ]; then  # TESTS_S=0: no tests
  echo "== tests"
  # TESTS_ARGS unquoted: its words are pytest arguments
  timeout "${TESTS_S:-150}" python -m pytest -v --tb=short -n "${TEST_WORKERS:-12}" --dist loadgroup \
    -p no:cacheprovider ${TESTS_ARGS:-} > "$out/tests.log" 2>&1
  status=$?
  [ "$status" = 0 ] || failed=1
  echo "pytest exit $status"; grep -E "FAILED|ERROR" "$out/tests.log" | head -n 30; tail -n 3 "$out/tests.log"
fi

progress() {  # a progress bar's updates (carriage returns) as lines of their own, each passed on as it comes
  python -c '
import sys
rest = b""
while chunk := sys.stdin.buffer.read1(65536):
    *lines, rest = (rest + chunk.replace(b"\r", b"\n")).split(b"\n")
    sys.stdout.buffer.writelines(line + b"\n" for line in lines if line.strip())
    sys.stdout.flush()
if rest.strip():
    sys.stdout.buffer.write(rest + b"\n")
'
}

since() { python -c "print(round($(date +%s.%N) - $1, 1))"; }  # seconds since the date +%s.%N given

within() {  # $1 seconds, at most what is left of DEADLINE after this script's start, less the report's time
  local left=$(( ${DEADLINE:-100000} - SECONDS - 45 ))
  echo $(( $1 < left ? $1 : left ))
}

repro() {  # $1: the run's name, $2: its time limit in seconds; the pipeline timed in two parts, reported after each
  local log="$out/$1_repro.log" started part wall status
  started=$(date +%s.%N)
  # first the stages the report reads (the training rate and the test accuracy), then the rest
  timeout "$2" dvc repro evaluate 2>&1 | progress | stamp > "$log"
  status=${PIPESTATUS[0]}
  wall=$(since "$started")
  echo "dvc repro evaluate exit $status after $wall s"
  if [ "$status" = 0 ]; then
    python benchmarks/gpu_report.py --name "$1" --wall-s "$wall" --log "$log" --out "metrics/gpu/$1.json" | tail -n 40
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "gpu_report.py failed: no report of $1"; failed=1; }
    part=$(date +%s.%N)  # the report's own time is no part of the pipeline's
    timeout "$(python -c "print(max(1, int($2 - $(since "$started"))))")" dvc repro 2>&1 | progress | stamp >> "$log"
    status=${PIPESTATUS[0]}
    wall=$(python -c "print(round($wall + $(since "$part"), 1))")
    echo "dvc repro exit $status after $wall s of dvc repro"
    if [ "$status" = 0 ]; then
      python benchmarks/gpu_report.py --name "$1" --pipeline-wall-s "$wall" --log "$log" --out "metrics/gpu/$1.json" \
        | grep -A 20 stage_seconds
      [ "${PIPESTATUS[0]}" = 0 ] || { echo "gpu_report.py failed: no pipeline wall time for $1"; failed=1; }
    fi
  fi
  [ "$status" = 0 ] || failed=1
  grep -E "Running stage|ERROR|rror:" "$log" | head -n 40
  cp dvc.lock "$out/$1_dvc.lock"
  tar czf "$out/$1.tgz" metrics dvclive "$log" "$out/$1_dvc.lock" 2>/dev/null
  rm -f "$out/$1_dvc.lock" "$log"
}

apply_recipe() {  # recipes/gpu.yaml, then the key=value arguments over it, into params.yaml
  python - "$@" <<'EOF'
import sys
import yaml
from vlm.recipe import apply, overrides

params = yaml.safe_load(open("params.yaml"))
values = overrides(yaml.safe_load(open("recipes/gpu.yaml")), params, "recipes/gpu.yaml")
values |= {key: yaml.safe_load(text) for key, _, text in (item.partition("=") for item in sys.argv[1:])}
apply(params, values, "benchmarks/gpu_session.sh")
for key, value in values.items():
    print(f"  {key} = {value}")
open("params.yaml", "w").write(yaml.safe_dump(params, sort_keys=False))
EOF
}

defaults=$(mktemp)
cp params.yaml "$defaults"
for part in ${PARTS-recipe default}; do  # PARTS="": the tests alone
  cp "$defaults" params.yaml
  case "$part" in
    default) title="default pipeline"; limit=$(within "${DEFAULT_S:-420}") ;;  # H200: 285 s up to evaluate
    recipe) title="GPU recipe"; limit=$(within "${RECIPE_S:-100000}") ;;
    *) echo "PARTS: $part is neither default nor recipe"; exit 1 ;;
  esac
  if [ "$limit" -le 0 ]; then echo "== $title: no time left"; continue; fi
  echo "== $title, at most $limit s"
  if [ "$part" = recipe ]; then apply_recipe "$@" || exit 1; fi
  repro "$part" "$limit"
done
exit "$failed"
