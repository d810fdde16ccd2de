#!/usr/bin/env bash
# Prepares the wheels that the lent GPU machine lacks (MLflow with its SQLite store), for Python 3.12 on
# x86-64, into DEST (default .whl): the device image has torch, Lightning, numpy, pandas, scikit-learn, ...
# but no MLflow, and it cannot reach a registry. Carry DEST to the device and install there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PYTHONPATH
# The closure is resolved by pip here; the packages the device image already holds (see KINDS.md) are
# left out, so that the wheels stay small (the carried tree is limited to 64 MiB) and none shadows the image's.
# Checked here with the same closure for Python 3.11, less the Databricks sign-in packages: an MLflow client
# creates a SQLite store, an experiment and a run, and logs a metric and a dict (16 MiB of wheels for 3.12).
set -euo pipefail
DEST=${1:-.whl}
PY=${PYTHON:-python3}
MLFLOW=${MLFLOW_VERSION:-3.17.2}
mkdir -p "$DEST"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$DEST" "mlflow-skinny==$MLFLOW" "mlflow-tracing==$MLFLOW" sqlalchemy alembic cryptography
# Already in the device image (KINDS.md, "Python packages already there"), or needed only to sign in to
# Databricks (google-auth): drop them.
present="anyio attrs certifi charset_normalizer click cloudpickle filelock fsspec h11 httpcore httpx idna
jinja2 markupsafe numpy packaging pandas protobuf pyarrow python_dateutil pyyaml PyYAML requests six
typing_extensions typing_inspect urllib3 zipp scipy scikit_learn joblib threadpoolctl markdown
werkzeug grpcio tqdm psutil pygments rich uvloop
google_auth pyasn1 pyasn1_modules"  # databricks sign-in only
# cryptography (with cffi, pycparser) stays: MLflow's SQLite model registry imports it (seen on an H200, 2026-11-26).
for name in $present; do
  rm -f "$DEST"/"$name"-*.whl "$DEST"/"${name,,}"-*.whl
done
ls -1 "$DEST"
du -sh "$DEST"
