#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (about 5 minutes after the install):
#   OUT=/path/to/results bash tools/gpu_check.sh
# 1. uses $VENV (default .venv) if its torch sees CUDA; otherwise installs the project into
#    $TMPDIR/streamnb-venv-gpu (a CPU build of torch 2.13.0 in .venv would satisfy the constraint, so it is not
#    reused). On Linux x86_64, torch==2.13.0 from PyPI (constraints.txt) is the CUDA build. The install needs PyPI
#    and is not counted in the 5 minutes.
# 2. runs the `#| cuda` cells of every notebook that has them (nbdev_test --flags cuda), tests/test_cuda.py and the
#    CUDA tests of tests/test_compile.py (use_streamnb_passes with torch's own runtime);
# 3. executes those notebooks in place with their outputs saved (jupyter nbconvert --execute --inplace), cleans
#    them (nbdev_clean keeps outputs), and copies them, their figures (the cells write to $OUT/figures) and the
#    logs to $OUT, to be brought back and committed.
# Every step runs even if an earlier one failed; the exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT/nbs" "$OUT/figures"
OUT="$(cd "$OUT" && pwd)"; export OUT
exec > >(tee "$OUT/gpu_check.log") 2>&1
export MPLBACKEND=Agg PYTHONUNBUFFERED=1
VENV="${VENV:-.venv}"
sees_cuda() { "$1/bin/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
failed=()
step() {   # step NAME SECONDS CMD...: run with a time limit, log the result, go on
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"; local t0=$SECONDS
  timeout "$limit" "$@"; local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name (rc=$rc)")
}

nvidia-smi || echo "nvidia-smi not found"
if ! sees_cuda "$VENV"; then
  VENV="${TMPDIR:-/tmp}/streamnb-venv-gpu"   # outside the work tree: nothing new for git to see
  if ! sees_cuda "$VENV"; then
    python3 -m venv "$VENV" || exit 1
    "$VENV/bin/pip" install -q -e ".[dev]" -c constraints.txt || { echo "install failed"; exit 1; }
  fi
fi
VENV="$(cd "$VENV" && pwd)"
export PATH="$VENV/bin:$PATH"
python - <<'EOF' | tee "$OUT/env.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available(): print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
EOF
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || { echo "torch sees no CUDA device"; exit 1; }

mapfile -t NBS < <(grep -l '"#| cuda' nbs/*.ipynb)
echo "notebooks with cuda cells: ${NBS[*]:-none}"

for nb in "${NBS[@]}"; do step "nbdev_test $nb" 150 nbdev_test --flags cuda --do_print --path "$nb"; done
step "pytest tests/test_cuda.py" 150 pytest -q -rs -p no:cacheprovider tests/test_cuda.py
# use_streamnb_passes under torch.compile with torch's own runtime (aot_eager) on CUDA streams: the test_cuda_* tests
# of tests/test_compile.py (skipped without CUDA; -rs lists any skip)
step "pytest tests/test_compile.py -k cuda" 150 pytest -q -rs -p no:cacheprovider tests/test_compile.py -k cuda
for nb in "${NBS[@]}"; do
  # --allow-errors: the notebook is saved with every output even if a cell fails; the grep then flags the failure
  step "execute $nb" 180 jupyter nbconvert --to notebook --execute --inplace --allow-errors \
       --ExecutePreprocessor.timeout=170 "$nb"
  step "no error outputs in $nb" 10 bash -c "! grep -q '\"output_type\": \"error\"' '$nb'"
  step "clean $nb" 60 nbdev_clean --fname "$nb"
  cp "$nb" "$OUT/nbs/"
done

ls -l "$OUT" "$OUT/nbs" "$OUT/figures"
if [ ${#failed[@]} -gt 0 ]; then printf 'FAILED: %s\n' "${failed[@]}"; exit 1; fi
echo "gpu_check: all steps passed"
