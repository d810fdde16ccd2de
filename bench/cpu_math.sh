#!/bin/bash
# CPU-independence experiment (issue 24): circles, seed 0, the reference protocol, one fresh store per math setting.
# Each setting trains and evaluates the four circles models in its own store (the training key does not hold the
# environment variables); then: python -m bench.cpu_math_diff outputs/cpu  (weights and cells against native).
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD MPLBACKEND=Agg CT_DATA_DIR=${CT_DATA_DIR:-}
PYTHON=${PYTHON:-.venv/bin/python}
run() {  # name, env assignments...
  name=$1; shift
  start=$(date +%s)
  env "$@" nice -n 5 $PYTHON recipes/compare.py --data circles --jobs 1 --seed 0 \
     --tracking-uri sqlite:///outputs/cpu/$name/mlflow.db --out-dir outputs/cpu/$name/out > outputs/cpu/$name.log 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - start ))s env=$*" >> outputs/cpu/walltimes.txt
}
mkdir -p outputs/cpu/{native,aten_default,mkl_compat,aten_default_mkl_compat,aten_avx2_mkl_avx2}
run native CT_CPU_MATH_NOTE=native
run aten_default ATEN_CPU_CAPABILITY=default
run mkl_compat MKL_CBWR=COMPATIBLE
run aten_default_mkl_compat ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE
run aten_avx2_mkl_avx2 ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2
# an AVX2-only host simulated on this AVX-512 one: natively, and with the portable settings
mkdir -p outputs/cpu/{avx2_host_native,avx2_host_portable}
run avx2_host_native ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
run avx2_host_portable ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE MKL_ENABLE_INSTRUCTIONS=AVX2
