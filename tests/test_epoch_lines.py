"""A training whose console is not a terminal (a log file, a pipe) shows one line per epoch, not redrawn bars."""

import io
import re


def test_a_run_logged_to_a_file_prints_one_line_per_epoch_and_no_bars(tmp_path, capfd):
    from ct_lightning.experiment.runs.train import train

    lines = []
    train({"data": "moons", "max_epochs": 3, "nce": 16, "max_steps": 3, "progress": True, "seed": 0,
           "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "checkpoint_dir": str(tmp_path / "ct")},
          echo=lambda *a, **k: lines.append(" ".join(map(str, a))))
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"], lines
    assert all(re.search(r"train/loss \d\.\d{3}, val/loss \d\.\d{3}, val/acc \d\.\d{3} \(\d+\.\d\d s\)$", line)
               for line in epochs), epochs
    assert "\r" not in capfd.readouterr().err  # pytest's stderr is no terminal: Lightning's bars stay off


def test_epoch_lines_are_for_consoles_that_are_not_terminals():
    from ct_lightning.callbacks.epoch_lines import wants_epoch_lines

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert wants_epoch_lines(True, io.StringIO()) and not wants_epoch_lines(True, Terminal())
    assert not wants_epoch_lines(False, io.StringIO())
