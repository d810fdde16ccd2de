"""Letters to applicants (``explain.py --letters DIR``): one short plain-text file per explained row, in the words
of the model's data spec (``label``, ``unit``, ``values``; ``datamodules.wording``).

Each letter says what the model assessed, the changes after which it would assess the row as the target (or that
none was found), and the facts that were held as they are (the immutable columns, with the row's values). It
states what the model computed and nothing else: no advice, no promise of a decision, no legal claim. The folder is
written at once: the letters go to a temporary folder beside it, which is renamed onto it when all are written.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import textwrap
from pathlib import Path

from ct_lightning.experiment.configuration.validation import InputError, check_writable_folder

NOTE = "This letter reports what a statistical model computed from the figures of your application. It is no " \
    "promise of a decision."
WIDTH = 78  # characters a line: a letter reads in any mail program or editor


def check_letters_folder(folder: str | os.PathLike | None, overwrite: bool = False) -> None:
    """``folder`` can take the letters: a new or empty folder, or one holding files only with ``overwrite``; a file
    or an unwritable place is refused in one line, before any work."""
    if not folder:
        return
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise InputError("--letters", str(path), "a folder for the letters (this path is a file)")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise InputError("--letters", str(path), "a new or empty folder, or --overwrite to replace the letters in "
                         "this one", "the folder holds files")
    check_writable_folder("--letters", path)


def _plain_name(text: str) -> str:
    """``text`` as part of a file name: letters, digits, ``.``, ``_`` and ``-``; anything else ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "_"


def letter_names(records: list[dict]) -> dict[int, str]:
    """The file name of each explained record's letter, by its ``row``: ``ID-1.txt`` by the rows' first column the
    model does not read (an identifier) where it names every explained row differently, else
    ``row-1.txt`` (the row's number, from 1)."""
    explained = [r for r in records if r.get("explained")]
    keys = [next(iter(r.get("other_columns") or {}), None) for r in explained]
    if explained and keys[0] is not None and all(key == keys[0] for key in keys):
        names = {r["row"]: f"{_plain_name(str(keys[0]))}-{_plain_name(str(r['other_columns'][keys[0]]))}.txt"
                 for r in explained}
        if len(set(names.values())) == len(names):
            return names
    return {r["row"]: f"row-{r['row']}.txt" for r in explained}


def _class(record: dict, key: str) -> str:
    """A class as the letter names it: the data spec's words for it, else the class itself."""
    return str(record.get(f"{key}_label") or record[key])


def letter_text(record: dict, codec) -> str:
    """The letter of one explained row (``record``: one of explain.py's JSON objects; ``codec``: the model's
    preprocessing, whose data spec words its columns and values)."""
    from ct_lightning.evaluation.explanation import _missing, change_of, change_parts, probability_text  # noqa: PLC0415

    # an identifier's column name as words: 'applicant_id' reads as code to an applicant
    who = ", ".join(f"{str(name).replace('_', ' ')} {value}" for name, value in
                    (record.get("other_columns") or {}).items() if not _missing(value)) or f"row {record['row']}"
    lines = [f"Your application ({who})", "",
             f"Assessment: the model assessed your application as {_class(record, 'prediction')} (probability "
             f"{probability_text(record['prediction_probability'])}).", ""]
    target = _class(record, "target")
    if record["valid"] and not record["changes"]:
        lines.append(f"The model already assesses it as {target}: nothing needs to change.")
    elif record["valid"]:
        reached = _class(record, "counterfactual_prediction")  # of an ordered outcome, perhaps above the target
        reached = target if reached == target else f"{reached}, at least {target}"
        lines.append(f"What would change it: with these figures, and all others as they are, the model would assess "
                     f"it as {reached} (probability {probability_text(record['probability'])}):")
        lines += [f"  - {name}: from {before} to {after}" for name, before, after in map(change_parts,
                                                                                        record["changes"])]
    else:
        lines.append(f"What would change it: we found no change of the figures that may change after which the model "
                     f"would assess it as {target}.")
    columns = {column.name: column for column in codec.columns}
    held = [change_parts(change_of(columns[name], record["factual"][name], record["factual"][name],
                                   bool(getattr(codec, "decimal_comma", False))))
            for name in record.get("immutable") or () if name in columns]
    if held:
        lines += ["", "These facts were held as they are:"]
        lines += [f"  - {name}: {value}" for name, value, _ in held]
    lines += ["", NOTE]
    return "\n".join(textwrap.fill(line, WIDTH, subsequent_indent="    " if line.startswith("  - ") else "",
                                   break_on_hyphens=False) if line else "" for line in lines) + "\n"


def write_letters(folder: str | os.PathLike, records: list[dict], codec, overwrite: bool = False) -> int:
    """Write one letter per explained record into ``folder`` (:func:`letter_text`, named by :func:`letter_names`),
    all at once: into a temporary folder beside it, renamed onto ``folder`` (an existing one, which
    :func:`check_letters_folder` let through, is replaced). Returns how many were written."""
    path = Path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        names = letter_names(records)
        for record in records:
            if record.get("explained"):
                (temporary / names[record["row"]]).write_text(letter_text(record, codec), encoding="utf-8")
                os.chmod(temporary / names[record["row"]], 0o644)
        os.chmod(temporary, 0o755)  # mkdtemp makes 0700: letters are meant to be sent on
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, old / path.name)
        os.replace(temporary, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return len(names)
