"""A checkpoint folder that fills up in the middle of training, and a truncated last checkpoint.

A full filesystem is a real one: a 2 MiB tmpfs (mounting needs root; elsewhere that test skips, and the
RLIMIT_FSIZE test, which the kernel enforces for any user, still covers a write that the system refuses).
"""

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import lightning as L
import pytest
import torch
from mlflow.tracking import MlflowClient

from ct_lightning.experiment.runs.checkpoint_io import AtomicCheckpointIO, previous_of
from ct_lightning.experiment.runs.lifecycle import completed_epochs
from ct_lightning.experiment.runs.train import train

# checkpoint_seconds 0: last.ckpt after every epoch, so that each epoch's write meets the fault (the faults, not the
# cadence, are tested here; tests/test_lifecycle.py resumes runs that write every few seconds)
TINY = {"data": "moons", "max_epochs": 4, "limit_train_batches": 3, "limit_val_batches": 1, "nce": 20,
        "progress": False, "seed": 5, "checkpoint_seconds": 0}


class FillDiskAt(L.Callback):
    """Fills the checkpoint folder's filesystem with one file as epoch ``epoch`` starts."""

    def __init__(self, folder: Path, epoch: int):
        self.folder, self.epoch = folder, epoch

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            with open(self.folder / "filler", "wb") as file:
                try:
                    while True:
                        file.write(b"\0" * 65536)
                        file.flush()
                except OSError as error:
                    assert error.errno == errno.ENOSPC


@pytest.fixture
def small_filesystem(tmp_path):
    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a 2 MiB tmpfs needs root (the RLIMIT_FSIZE test covers a refused write)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()[:200]})")
    yield folder
    subprocess.run(["umount", str(folder)], check=False)


def test_a_full_checkpoint_folder_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path,
                                                                                         small_filesystem):
    store = {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "full-disk"}
    folder = small_filesystem / "checkpoints"
    with pytest.raises(OSError) as raised:
        train({**TINY, **store, "checkpoint_dir": str(folder)}, callbacks=[FillDiskAt(small_filesystem, 2)])
    message = str(raised.value)
    assert "\n" not in message and raised.value.errno == errno.ENOSPC
    assert message.startswith(f"checkpoint_dir: cannot write a checkpoint in {folder} (No space left on device); "
                              f"the last good checkpoint {folder / 'last.ckpt'} is intact"), message
    assert "--resume" in message
    assert completed_epochs(folder / "last.ckpt") == 2  # epochs 0 and 1, written before the disk filled
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")], "no temporary file left behind"
    client = MlflowClient(store["tracking_uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("full-disk").experiment_id])
    assert run.info.status == "FAILED"
    # Free the space: --resume finishes the run.
    (small_filesystem / "filler").unlink()
    resumed = train({"resume": "latest", **store, "progress": False})
    assert resumed["run_id"] == run.info.run_id and resumed["metrics"]["epochs"] == TINY["max_epochs"]


def _save_under_a_file_size_limit(path: str, limit: int) -> None:
    """Child process: write a ~1 MB checkpoint over an existing one with RLIMIT_FSIZE = ``limit`` bytes."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        AtomicCheckpointIO().save_checkpoint({"epoch": 9, "state_dict": {"w": torch.zeros(250_000)}}, path)
    except OSError as error:
        sys.exit(f"errno {error.errno}")
    sys.exit("saved")


def test_a_refused_write_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"epoch": 1, "state_dict": {"w": torch.ones(3)}}, path)
    AtomicCheckpointIO().save_checkpoint({"epoch": 2, "state_dict": {"w": torch.ones(3)}}, path)
    assert completed_epochs(path) == 3 and completed_epochs(previous_of(path)) == 2
    before = path.read_bytes()
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                           f"from test_checkpoint_faults import _save_under_a_file_size_limit as save; "
                           f"save({str(path)!r}, 100_000)"], capture_output=True, text=True, timeout=300)
    assert done.stderr.strip().splitlines()[-1] == f"errno {errno.EFBIG}", done.stderr[-2000:]
    assert path.read_bytes() == before and completed_epochs(path) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last-previous.ckpt", "last.ckpt"]


def test_a_truncated_last_checkpoint_resumes_from_the_previous_one_and_says_so(tmp_path):
    store = {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": f"truncated-{uuid.uuid4().hex[:6]}"}
    from preloaded import run_script  # here: a subprocess above imports this file with only tests/ on its path

    done = run_script(Path(__file__).parent / "helpers" / "kill_during_training.py",
                      [json.dumps({**TINY, **store}), "epoch_start", "3", "0"], cwd=Path(__file__).parents[1])
    assert done.returncode == -9, done.stderr[-3000:]
    client = MlflowClient(store["tracking_uri"])
    (run,) = client.search_runs([client.get_experiment_by_name(store["experiment"]).experiment_id])
    last = Path(run.data.tags["ct.checkpoint_dir"]) / "last.ckpt"
    assert completed_epochs(last) == 3 and completed_epochs(previous_of(last)) == 2
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # a copy cut short
    lines = []
    resumed = train({"resume": "latest", **store, "progress": False},
                    echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert resumed["run_id"] == run.info.run_id and resumed["metrics"]["epochs"] == TINY["max_epochs"]
    assert any(line.startswith(f"resume: {last} is unreadable") and str(previous_of(last)) in line
               and "after 2 epoch(s)" in line for line in lines), lines
