"""The start-up line that says what a training's searches keep to, for every data set (a built-in one with
``--protect`` printed none: what ``--protect`` held could not be seen)."""

from __future__ import annotations

from ct_lightning.experiment.configuration.data import SHOWN_HELD, mutability_line


def test_the_line_names_each_held_feature_and_the_options_that_gave_them():
    config = {"immutable": ["x1"], "mutability": "x2=increase", "protect": False}
    assert mutability_line(config, {"x1": "none", "x2": "increase", "x3": "both"}, from_data=False) == \
        "mutability (--immutable, --mutability): x1: none, x2: increase"
    assert mutability_line({"protect": True}, {"age": "none"}, from_data=True) == \
        "mutability (data spec, --protect): age: none"
    assert mutability_line({}, {"x1": "both"}, from_data=False) is None and mutability_line({}, {}, False) is None


def test_a_long_list_of_one_kind_is_cut_and_counted():
    pixels = [f"p{i}" for i in range(3 * SHOWN_HELD)]
    held = {**{name: "none" for name in pixels}, "q": "increase"}
    line = mutability_line({"protect": True, "mutability": "q=increase"}, held, from_data=False)
    kept = ", ".join(pixels[:SHOWN_HELD - 1])
    assert line == f"mutability (--mutability, --protect): none: {kept}, ..., {pixels[-1]} ({len(pixels)} features); " \
                   "increase: q"


def test_a_built_in_data_set_with_protect_says_what_it_holds(tmp_path):
    from ct_lightning.experiment.runs.train import train

    lines: list[str] = []
    train({"data": "ls", "protect": True, "max_epochs": 1, "nce": 8, "limit_train_batches": 1, "progress": False,
           "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "checkpoint_dir": str(tmp_path / "ck")},
          echo=lambda *parts, **_: lines.append(" ".join(map(str, parts))))
    assert "mutability (--protect): x1: none" in lines
