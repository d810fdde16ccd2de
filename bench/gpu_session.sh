#!/usr/bin/env bash
# Issue 27's checks on the lent GPU machine, one device call each (folders from bench/gpu_carry.sh; run from
# .gpuwt). Logs and JSON go to $OUT (the device tool brings them back).
#   checks  tests/test_gpu.py with MLflow, then bench/gpu_probe.py (host syncs of a fused epoch, profiler,
#           plain eager epoch vs one CUDA graph per epoch)                                       (~3-4 min)
#   bench   bench/run.py --accelerator gpu (QUICK=1: --quick): the accelerator section of docs/performance.md
#   table1  recipes/compare.py --data all --accelerator gpu --jobs ${JOBS:-8}, timed end to end
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ../.whl/*.whl \
  || exit 3
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CT_DATA_DIR=${CT_DATA_DIR:-$PWD/../.gpudata}
case "${1:-}" in
  checks)
    nvidia-smi -L
    python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_epoch_block_transfer.py 2>&1 \
      | tee "$OUT/pytest.log" | tail -15
    timeout 300 python3 bench/gpu_probe.py --data circles,adult --epochs 5 --out "$OUT/probe.json" \
      --profile-out "$OUT/prof" 2>&1 | grep -v Warning | tee "$OUT/probe.log" ;;
  bench)
    python3 bench/run.py --accelerator gpu ${QUICK:+--quick} --json "$OUT/gpu_results.json" 2>&1 \
      | grep -v Warning | tee "$OUT/bench.log"
    cp docs/performance.md "$OUT/performance.md" ;;
  table1)
    mkdir -p /tmp/t1; started=$(date +%s.%N)
    python3 recipes/compare.py --data all --accelerator gpu --jobs "${JOBS:-8}" \
      --tracking-uri "sqlite:////tmp/t1/mlflow.db" --out-dir "$OUT/table1" 2>&1 | grep -v Warning \
      | tee "$OUT/table1.log"
    echo "table1 wall seconds: $(echo "$(date +%s.%N) - $started" | bc)" | tee -a "$OUT/table1.log" ;;
  *) echo "usage: bash bench/gpu_session.sh checks|bench|table1" >&2; exit 2 ;;
esac
