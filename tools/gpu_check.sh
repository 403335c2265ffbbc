#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (about 6 minutes; every step has a limit, 10 minutes in all):
#   OUT=/path/to/results bash tools/gpu_check.sh
# 1. picks a Python whose torch sees CUDA: $VENV (default .venv), else the machine's python3 (an offline machine
#    with PyTorch installed: the project is put on PYTHONPATH, and the pure-Python wheels of the notebook toolchain
#    are installed from .whl/ if that folder is there), else installs the project into $TMPDIR/streamnb-venv-gpu
#    (needs PyPI; on Linux x86_64, torch==2.13.0 from PyPI is the CUDA build);
# 2. executes 19a_cuda_demos in place with its outputs saved (tools/run_nb.py; the cells write figures to
#    $OUT/figures), runs tests/test_cuda.py and the CUDA tests of tests/test_compile.py (use_streamnb_passes with
#    torch's own runtime), benchmarks/gpu_measurements.py (launch costs, roofline fractions, published models, user
#    programs under torch.compile), and nbdev_test --flags cuda;
# 3. cleans the executed notebook (nbdev_clean keeps outputs) and packs it, the figures, the measurements and the log
#    into $OUT/gpu_results.tar.gz, to be brought back and committed ($OUT also gets the log and the measurements).
# Every step runs even if an earlier one failed; the exit status is non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder that receives the results}"
DEST="$(mkdir -p "$OUT" && cd "$OUT" && pwd)"
export OUT="${TMPDIR:-/tmp}/streamnb-gpu-results"   # where the cells and steps write; packed into $DEST at the end
rm -rf "$OUT"; mkdir -p "$OUT/nbs" "$OUT/figures"
exec > >(tee "$DEST/gpu_check.log") 2>&1
export MPLBACKEND=Agg PYTHONUNBUFFERED=1
VENV="${VENV:-.venv}"
# GPU_CHECK_DRY=1 runs every step on a machine without CUDA (the cells then print that they need a GPU): to check this
# script's own flow before spending device time on it.
sees_cuda() { [ -x "$1" ] && timeout 120 "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() or '${GPU_CHECK_DRY:-}' else 1)" 2>/dev/null; }
failed=()
step() {   # step NAME SECONDS CMD...: run with a time limit, log the result, go on
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"; local t0=$SECONDS
  timeout "$limit" "$@"; local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name (rc=$rc)")
}

nvidia-smi || echo "nvidia-smi not found"
# PY: the absolute path of an interpreter whose torch sees CUDA. No link or wrapper to it is made: a link to a venv's
# python loses the venv, and a file written over a link left by an earlier run on the same machine would overwrite
# the interpreter itself.
SYS_PY="$(command -v python3 || true)"
if sees_cuda "$VENV/bin/python"; then PY="$(cd "$VENV/bin" && pwd)/python"; BIN="$(dirname "$PY")"
elif [ -n "$SYS_PY" ] && sees_cuda "$SYS_PY"; then
  PY="$SYS_PY"
  SITE="${TMPDIR:-/tmp}/streamnb-site"; rm -rf "$SITE"
  if [ -d .whl ]; then timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1; fi
  export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"; BIN="$SITE/bin"
else
  VENV="${TMPDIR:-/tmp}/streamnb-venv-gpu"   # outside the work tree: nothing new for git to see
  if ! sees_cuda "$VENV/bin/python"; then
    python3 -m venv "$VENV" || exit 1
    "$VENV/bin/pip" install -q -e ".[dev]" -c constraints.txt || { echo "install failed"; exit 1; }
  fi
  PY="$VENV/bin/python"; BIN="$VENV/bin"
fi
echo "python: $PY; console scripts: $BIN"
timeout 120 "$PY" - <<'PY' | tee "$OUT/env.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available(): print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
PY
timeout 120 "$PY" -c "import streamnb, nbdev, execnb; print('streamnb', streamnb.__file__)" || failed+=("imports")

NB=nbs/19a_cuda_demos.ipynb
step "execute $NB" 150 "$PY" tools/run_nb.py "$NB"
step "clean $NB" 30 "$BIN/nbdev_clean" --fname "$NB"
cp "$NB" "$OUT/nbs/"
step "pytest CUDA tests" 120 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_compile.py tests/test_readme.py -k "cuda"
step "gpu_measurements" 150 "$PY" benchmarks/gpu_measurements.py --out "$OUT/gpu_measurements.json"
step "nbdev_test $NB" 120 "$BIN/nbdev_test" --flags cuda --do_print --path "$NB"

ls -l "$OUT" "$OUT/nbs" "$OUT/figures"
if [ ${#failed[@]} -gt 0 ]; then printf 'FAILED: %s\n' "${failed[@]}"; else echo "gpu_check: all steps passed"; fi
cp "$OUT"/gpu_measurements.json "$DEST"/ 2>/dev/null
tar -czf "$DEST/gpu_results.tar.gz" -C "$OUT" .
[ ${#failed[@]} -eq 0 ]
