"""A new local SQLite store starts as a copy of the empty store MLflow created first (store_template), not by MLflow's
migrations: the same schema, its own Default experiment, usable as any store."""

from __future__ import annotations

import sqlite3
from contextlib import closing

from mlflow.tracking import MlflowClient

from ct_lightning.experiment.runs.store_template import copy_template, template_file
from ct_lightning.experiment.runs.tracking import prepare_store


def _schema(database) -> list:
    with closing(sqlite3.connect(database)) as connection:
        return connection.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def _experiments(database) -> list:
    with closing(sqlite3.connect(database)) as connection:
        return connection.execute("SELECT experiment_id, name, artifact_location FROM experiments "
                                  "ORDER BY experiment_id").fetchall()


def test_second_store_is_a_copy_of_the_first(tmp_path, monkeypatch):
    monkeypatch.setenv("CT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    first, second = tmp_path / "one" / "mlflow.db", tmp_path / "two" / "mlflow.db"
    prepare_store(f"sqlite:///{first}", "exp")  # MLflow migrates this one; it becomes the template
    template = template_file()
    assert template is not None and template.is_file() and template.parent == tmp_path / "cache" / "mlflow-store"
    assert _experiments(template) == [] and _schema(template) == _schema(first)  # its Default experiment left out

    second.parent.mkdir()
    assert copy_template(second) and _schema(second) == _schema(first)
    assert not copy_template(second)  # an existing store is never replaced
    second.unlink()
    artifacts = prepare_store(f"sqlite:///{second}", "exp")
    # MLflow adds the Default experiment where it opens the store, as it does in a store it creates; ids as there
    assert [row[:2] for row in _experiments(second)] == [(0, "Default"), (1, "exp")] == \
        [row[:2] for row in _experiments(first)]
    client = MlflowClient(tracking_uri=f"sqlite:///{second}")
    experiment = client.get_experiment_by_name("exp")
    assert experiment.artifact_location == artifacts == (tmp_path / "two" / "artifacts").as_uri()
    run = client.create_run(experiment.experiment_id)
    client.log_metric(run.info.run_id, "m", 1.0)
    client.create_registered_model("model")
    assert client.get_run(run.info.run_id).data.metrics == {"m": 1.0}
    assert _experiments(template) == []  # the template is never written through a store


def test_template_only_from_an_empty_store(tmp_path, monkeypatch):
    """A store that holds runs or experiments already is never kept as the template."""
    from ct_lightning.experiment.runs.store_template import keep_template

    monkeypatch.setenv("CT_CACHE_DIR", str(tmp_path / "cache"))
    database = tmp_path / "used" / "mlflow.db"
    database.parent.mkdir()
    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    client.create_experiment("holds-something", artifact_location=(tmp_path / "a").as_uri())
    assert not keep_template(database) and not template_file().exists()


def test_a_damaged_template_is_dropped(tmp_path, monkeypatch):
    """A template damaged since it was kept is not copied: MLflow creates the store, which becomes the new template."""
    monkeypatch.setenv("CT_CACHE_DIR", str(tmp_path / "cache"))
    prepare_store(f"sqlite:///{tmp_path / 'one' / 'mlflow.db'}")
    template = template_file()
    template.write_bytes(template.read_bytes()[:4096])  # cut short
    second = tmp_path / "two" / "mlflow.db"
    second.parent.mkdir()
    assert not copy_template(second) and not second.exists() and not template.exists()
    prepare_store(f"sqlite:///{second}", "exp")
    assert MlflowClient(tracking_uri=f"sqlite:///{second}").get_experiment_by_name("exp") is not None
    assert template.is_file() and _experiments(template) == []
