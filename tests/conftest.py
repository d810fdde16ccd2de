"""Test-wide settings: where the shared raw data lives, and a private cache for processed data."""

import os
from pathlib import Path

# Small models run fastest on one thread, and oversubscribed threads stall on a loaded 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import matplotlib  # noqa: E402
import torch  # noqa: E402

matplotlib.use("Agg")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# CI sets CT_DATA_DIR to ../shared/data/raw; a developer checkout finds the same folder beside the repo.
os.environ.setdefault("CT_DATA_DIR", str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "raw"))
