"""Test-wide settings: where the shared raw data lives, and a private cache for processed data."""

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

# CI sets CT_DATA_DIR to ../shared/data/raw; a developer checkout finds the same folder beside the repo.
os.environ.setdefault("CT_DATA_DIR", str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "raw"))
# Downloads never run in tests: the raw files must come from CT_DATA_DIR.
os.environ.setdefault("CT_OFFLINE", "1")
