#!/usr/bin/env bash
# Prepares, in the checkout that the device tool sends (SESSION, default /work/main), the three folders a call
# to the lent GPU machine carries: .gpuwt (this working tree's files, tracked and untracked-not-ignored),
# .whl (MLflow's wheels, bench/gpu_wheels.sh) and .gpudata (the raw real data, for Table 1 and the bench).
# Each must be ignored there: the script adds them to SESSION/.git/info/exclude. Then, in a device call,
#   carry [".gpuwt", ".whl", ".gpudata"] and run:  cd .gpuwt && bash bench/gpu_session.sh checks|bench|table1
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
SESSION=${1:-/work/main}
DATA=${CT_DATA_DIR:-/work/shared/data/raw}
mkdir -p "$SESSION/.git/info"
for d in /.gpuwt/ /.whl/ /.gpudata/; do
  grep -qxF "$d" "$SESSION/.git/info/exclude" 2>/dev/null || echo "$d" >> "$SESSION/.git/info/exclude"
done
rm -rf "$SESSION/.gpuwt" && mkdir -p "$SESSION/.gpuwt"
(cd "$SRC" && git ls-files -co --exclude-standard -z | tar --null -cf - -T -) | tar -xf - -C "$SESSION/.gpuwt"
[ -d "$SESSION/.whl" ] || PYTHON=${PYTHON:-python3} "$SRC/bench/gpu_wheels.sh" "$SESSION/.whl"
if [ "${WITH_DATA:-1}" = 1 ] && [ -d "$DATA" ]; then
  rm -rf "$SESSION/.gpudata" && cp -r "$DATA" "$SESSION/.gpudata"
fi
du -sh "$SESSION/.gpuwt" "$SESSION/.whl" "$SESSION/.gpudata" 2>/dev/null || true
