#!/usr/bin/env bash
# Issue 27's checks on the lent GPU machine, one device call each (folders from bench/gpu_carry.sh; run from
# .gpuwt). Logs and JSON go to $OUT (the device tool brings them back).
#   checks  tests/test_gpu.py with MLflow, then bench/gpu_probe.py (host syncs of a fused epoch, profiler,
#           plain eager epoch vs one CUDA graph per epoch)                                       (~3-4 min)
#   bench   bench/run.py --accelerator gpu (QUICK=1: --quick): the accelerator section of docs/performance.md
#   table1  recipes/compare.py --data all --accelerator gpu --jobs ${JOBS:-8}, timed end to end
#   appendix  issue 25 §4: 100-epoch CT on MNIST (MLP, then CNN) through recipes/train.py, timed end to end; the
#           stacked grid on the GPU (bench/stacked_grid.py --accelerator gpu); tests/test_gpu.py      (~6-7 min)
# WHL and CT_DATA_DIR name the carried wheels and data (default: beside .gpuwt; from the repository root:
#   WHL=.whl CT_DATA_DIR=$PWD/.gpudata bash bench/gpu_session.sh appendix).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site ${WHL:-../.whl}/*.whl \
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
    echo "table1 wall seconds: $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" \
      "$started" "$(date +%s.%N)")" | tee -a "$OUT/table1.log" ;;
  appendix)
    nvidia-smi -L
    for model in mlp cnn; do
      started=$(date +%s.%N)
      timeout 240 python3 recipes/train.py --data mnist --model $model --max-epochs 100 --accelerator gpu --no-progress \
        --tracking-uri "sqlite:////tmp/mnist/mlflow.db" --summary-json "$OUT/mnist_$model.json" 2>&1 | grep -v Warning \
        | tail -5 | tee "$OUT/mnist_$model.log"
      echo "mnist $model: wall seconds $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$started" "$(date +%s.%N)")" | tee -a "$OUT/mnist_$model.log"
    done
    timeout 200 python3 bench/stacked_grid.py --accelerator gpu --separate "${SEPARATE:-1}" --stacks "${STACKS:-9,45}" \
      --out "$OUT/stacked_grid_gpu.json" 2>&1 | grep -v Warning | grep '^{"form' | tee "$OUT/stacked_grid.log"
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/pytest.log" | tail -8 ;;
  *) echo "usage: bash bench/gpu_session.sh checks|bench|table1|appendix" >&2; exit 2 ;;
esac
