#!/usr/bin/env bash
# Run here once before using the device tool: fills .whl/ (git-ignored) with the cp312 wheels the lent GPU machine
# lacks, which scripts/gpu_check.sh installs offline there.
#
#   scripts/prepare_gpu_wheels.sh [WHEEL_DIR]      (default: ../shared/wheels-py312, beside the checkout)
#
# The GPU image already has torch, triton, einops, typer, rich, pandas, tabulate, pyyaml, psutil, nvidia-ml-py,
# matplotlib, numpy, scipy, pytest, pytest-xdist, hypothesis and sortedcontainers (/work/.library/device/KINDS.md);
# it lacks pydantic, and flash-linear-attention (kernel: fla). So .whl/ gets pydantic, fla-core where the folder has
# it, and exactly the packages they need that the image lacks (read from each wheel's Requires-Dist), nothing else:
# a carried copy of a package the image has would shadow the image's own. Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE=${1:-../shared/wheels-py312}
PY=${PYTHON:-python3}
if ! ls "$SOURCE"/*.whl > /dev/null 2>&1; then
  echo "error: no wheels in $SOURCE" >&2
  echo "hint: pass the folder holding the cp312 pydantic wheels (see its README): $0 WHEEL_DIR" >&2
  exit 2
fi
rm -rf .whl
mkdir -p .whl
"$PY" - "$SOURCE" .whl << 'EOF'
"""Copy pydantic's wheel, fla-core's if there, and their dependencies', transitively, from argv[1] to argv[2]."""

import re
import shutil
import sys
import zipfile
from email.parser import Parser
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


source, target = Path(sys.argv[1]), Path(sys.argv[2])
wheels = {}
for wheel in sorted(source.glob("*.whl")):
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        headers = Parser().parsestr(archive.read(metadata).decode())
    needs = [r for r in headers.get_all("Requires-Dist") or [] if "extra ==" not in r]
    wheels[canonical(headers["Name"])] = (wheel, [canonical(re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0]) for r in needs])
# What the GPU image has of what fla-core needs (its CUDA extra's torch and triton, and einops): never carried.
IMAGE = {"torch", "triton", "einops"}
wanted, todo = set(), ["pydantic", *(["fla-core"] if "fla-core" in wheels else [])]
while todo:
    name = todo.pop()
    if name in wanted or name in IMAGE:
        continue
    if name not in wheels:
        sys.exit(f"error: {source} has no wheel for {name}, which pydantic or fla-core needs")
    wanted.add(name)
    todo += wheels[name][1]
for name in sorted(wanted):
    shutil.copy2(wheels[name][0], target)
    print(f"{wheels[name][0].name}")
left = sorted(set(wheels) - wanted)
if left:
    print(f"not carried (not needed by pydantic or fla-core): {', '.join(left)}")
EOF
