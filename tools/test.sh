#!/usr/bin/env bash
# The test command: library in sync with the notebooks, every notebook's CPU cells (nbdev_test), then pytest.
# Each notebook runs once: nbdev_test runs them here, so pytest leaves out tests/test_notebooks.py (the same notebooks
# through nbdev's own test_nb, so that a plain `pytest` still fails on a broken notebook).
set -euo pipefail
cd "$(dirname "$0")/.."
export MPLBACKEND=Agg
bash tools/check_sync.sh
nbdev_test --n_workers 0
pytest -q -p no:cacheprovider --ignore=tests/test_notebooks.py
