#!/usr/bin/env bash
# The notebook toolchain as pure-Python wheels in .whl/ (git-ignored through .git/info/exclude), for a GPU machine that
# has PyTorch but no package index: tools/gpu_check.sh installs them there into a throwaway folder. With this
# workplace's device tool: run this once here, then `run` `OUT=$OUT bash tools/gpu_check.sh` with carry [".whl"] and a
# limit of 600 s (the script's steps are limited to 10 minutes in all; the run takes about 6).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info; grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .whl nbdev==2.4.14 execnb==0.1.18 fastcore==1.14.5 ghapi==2.0.3 fastgit==0.1.4 astunparse==1.6.3 watchdog==7.1.0 \
  asttokens==3.0.2 executing==2.3.0 ipython==9.18.1 ipython-pygments-lexers==1.1.1 jedi==0.20.1 parso==0.8.7 \
  matplotlib-inline==0.2.2 pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 pure_eval==0.2.4 stack-data==0.6.3 \
  traitlets==5.16.1 wcwidth==0.9.4
ls .whl
