"""A new local SQLite store as a copy of an empty one that MLflow created before, instead of MLflow's migrations.

MLflow creates a SQLite store by running its ~70 schema migrations one by one (1.5 s on a quiet 2-core machine, several
seconds under load), once per store: a user's first run, and each test that starts from an empty folder. The first
store MLflow creates is kept (``template_file``), right after its creation and before anything is written to it, with
its ``Default`` experiment left out (that row names a folder of its own; MLflow adds it again, for the new store's
folder, when it opens a store without one). A later new store starts as a copy of it; MLflow then opens it as any store
it made: it checks the schema's revision and adds the ``Default`` experiment. The copy is kept per MLflow version and
per set of its migration files, so another MLflow never opens a schema it did not make; wherever something is missing
or unexpected (no cache folder, a template with other rows), MLflow creates the store itself, as before.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path

from datamodules.paths import CACHE_DIR_ENV, user_cache_root

# The rows of a store MLflow just created, besides the Default experiment: its schema revision and default workspace.
SEEDED_TABLES = ("alembic_version", "workspaces")


def template_folder() -> Path:
    """``$CT_CACHE_DIR/mlflow-store``, else ``$XDG_CACHE_HOME/ct-lightning/mlflow-store`` (``~/.cache/...``)."""
    base = os.environ.get(CACHE_DIR_ENV)
    return (Path(base).expanduser() if base else user_cache_root()) / "mlflow-store"


def template_file() -> Path | None:
    """The template of this MLflow (its version and the names of its migration files, hashed), ``None`` where its
    migrations cannot be found."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    migrations = Path(next(iter(spec.submodule_search_locations))) / "store" / "db_migrations" / "versions"
    try:
        names = sorted(path.name for path in migrations.iterdir() if path.suffix == ".py")
    except OSError:
        return None
    if not names:
        return None
    import mlflow  # noqa: PLC0415 - imported already where a store is opened

    digest = hashlib.sha256("\n".join([mlflow.__version__, *names]).encode()).hexdigest()[:16]
    return template_folder() / f"mlflow-{mlflow.__version__}-{digest}.db"


def copy_template(database: Path) -> bool:
    """Start the store ``database`` (which must not exist yet) as a copy of the template; ``False`` where there is
    none (MLflow then creates the store). The copy appears whole or not at all."""
    template = template_file()
    if template is None or database.exists() or not template.is_file():
        return False
    if not _sound(template):  # damaged since it was kept: dropped, MLflow creates this store (a new template)
        template.unlink(missing_ok=True)
        return False
    partial = database.with_name(f".{database.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(template, partial)
        os.replace(partial, database)
    except OSError:
        partial.unlink(missing_ok=True)
        return False
    return True


def _sound(template: Path) -> bool:
    """Whether ``template`` is an intact SQLite file with a schema revision and no experiment."""
    try:
        with closing(sqlite3.connect(f"{template.as_uri()}?mode=ro", uri=True)) as connection:
            return connection.execute("PRAGMA quick_check").fetchone() == ("ok",) \
                and connection.execute("SELECT COUNT(*) FROM alembic_version").fetchone() == (1,) \
                and connection.execute("SELECT COUNT(*) FROM experiments").fetchone() == (0,)
    except sqlite3.Error:
        return False


def keep_template(database: Path) -> bool:
    """Keep the store ``database``, which MLflow has just created and nothing has written to, as the template (its
    ``Default`` experiment left out); ``False`` where it is not kept (a template exists, no cache folder can be
    written, or the store holds rows other than those MLflow seeds). Never fails the run."""
    template = template_file()
    if template is None or template.is_file():
        return False
    partial = None
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=".template-", suffix=".partial", dir=template.parent)
        os.close(handle)
        partial = Path(name)
        with closing(sqlite3.connect(database)) as source, closing(sqlite3.connect(partial)) as copy:
            source.backup(copy)  # a consistent snapshot, even while MLflow holds the store open
        with closing(sqlite3.connect(partial)) as copy:
            copy.execute("DELETE FROM experiments WHERE experiment_id = 0 AND name = 'Default'")
            copy.commit()
            tables = [row[0] for row in copy.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            filled = [table for table in tables if table not in SEEDED_TABLES
                      and copy.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchone()]  # noqa: S608 - table names
        if filled or "alembic_version" not in tables:
            partial.unlink()
            return False
        os.replace(partial, template)
        return True
    except (OSError, sqlite3.Error):
        if partial is not None:
            partial.unlink(missing_ok=True)
        return False
