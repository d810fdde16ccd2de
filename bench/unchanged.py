"""The "results are unchanged" check of issue 13: short seeded ``train()`` runs of CT on circles and Adult, printing
the final metrics and the per-epoch counterfactual statistics as JSON (the last line, after ``RESULT``).

Run it in two code trees and compare, e.g. the tree before the change from ``git archive REV | tar -x -C /tmp/old``:

    (cd /tmp/old && PYTHONPATH=/tmp/old python /path/to/bench/unchanged.py) > old.txt
    PYTHONPATH=$PWD python bench/unchanged.py > new.txt
"""

import json
import logging
import os
import tempfile
import warnings

import torch

HISTORY = ("train/cf_converged", "train/cf_steps", "train/cf_nascent", "train/loss", "train/div", "train/adv",
           "val/acc")


def main() -> dict:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("CT_DATA_DIR", "/work/shared/data/raw")
    os.environ.setdefault("CT_OFFLINE", "1")
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.runs.train import train

    out = {}
    for data, epochs in (("circles", 5), ("adult", 3)):
        uri = f"sqlite:///{tempfile.mkdtemp(prefix='ct-unchanged-')}/mlflow.db"
        summary = train({"data": data, "objective": "full", "max_epochs": epochs, "seed": 0, "progress": False,
                         "tracking_uri": uri})
        client = MlflowClient(uri)
        history = {key: [round(m.value, 6) for m in sorted(client.get_metric_history(summary["run_id"], key),
                                                            key=lambda m: m.step)] for key in HISTORY}
        final = {k: round(v, 6) if isinstance(v, float) else v for k, v in summary["metrics"].items()
                 if k != "fit_seconds"}
        out[data] = {"final": final, "history": history}
    print("RESULT " + json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
