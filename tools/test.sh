#!/usr/bin/env bash
# The test command: library in sync with the notebooks, every notebook's CPU cells (nbdev_test), then pytest.
# Both use the machine's 2 cores (CI's too): notebooks run 2 at a time, pytest in 2 worker processes, each test file
# in one (--dist loadfile: module fixtures and a file's shared state stay in one process). Serial, CI took 11.7 min.
# Each notebook runs once: nbdev_test runs them here, so pytest leaves out tests/test_notebooks.py (the same notebooks
# through nbdev's own test_nb, so that a plain `pytest` still fails on a broken notebook).
set -euo pipefail
cd "$(dirname "$0")/.."
export MPLBACKEND=Agg
bash tools/check_sync.sh
nbdev_test --n_workers 2
pytest -q -p no:cacheprovider -n 2 --dist loadfile --ignore=tests/test_notebooks.py --durations=15
