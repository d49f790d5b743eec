#!/usr/bin/env bash
# Run here (with network to PyPI) once before using the device tool: fills .whl/ (git-ignored) with the cp312
# wheels the lent GPU machine lacks, which scripts/gpu_check.sh installs offline.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
cp ../shared/wheels-py312/*.whl .whl/ 2>/dev/null || true   # pydantic and what it needs
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  tabulate==0.10.0 hypothesis==6.170.17 sortedcontainers==2.4.0
ls .whl
