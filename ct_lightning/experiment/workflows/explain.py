"""``recipes/explain.py``: explain rows in their own units with a trained model (``experiment.explanations``),
print the explanations, write them as JSON and log them to the model's run."""

from __future__ import annotations

import argparse
from pathlib import Path

from ct_lightning.experiment.runs.atomic_files import write_json_atomic
from ct_lightning.experiment.runs.registry import is_registered_uri, run_of_reference
from ct_lightning.experiment.runs.tracking_server import is_permission_denied, run_write_refused, write_refused_now
from ct_lightning.experiment.runner import checking
from ct_lightning.experiment.configuration.settings import SETTINGS_BY_NAME, TABLE_FILE
from ct_lightning.experiment.configuration.validation import (InputError, check_checkpoint_file,
                                                                check_output_file, check_run_ids)
from datamodules.suggest import path_hint
from datamodules.workbook import table_file

SEARCH = ["generator", "tau", "max_steps", "epsilon", "lambda_cost", "lambda_energy", "search_lr", "generator_options"]
# train.py's options for a model of your own, typed here: the model, its inputs and its data spec come with a run
_OWN_MODEL = ("explain.py explains a model that train.py logged, which carries its inputs, outputs and data spec: log "
              "yours as it is with train.py --data FILE --target COLUMN --from-checkpoint MODEL.pt --model-inputs "
              "FILE [--data-spec FILE] --limit-train-batches 0, then explain.py --run-id ID")
OPTION_HINTS = {"--model-inputs": _OWN_MODEL, "--from-checkpoint": _OWN_MODEL, "--model": _OWN_MODEL,
                "--data-spec": "the model's data spec comes with it (train.py --data-spec); here --immutable, "
                               "--mutability, --step and --max-change add to it for one explanation"}


def add_explanation_outputs(parser: argparse.ArgumentParser) -> None:
    """explain.py's files: ``--json``, ``--csv`` and ``--letters`` (each refused where it exists, unless
    ``--overwrite``)."""
    parser.add_argument("--json", help="write the explanations here, one object per row (an existing file is "
                        "refused unless --overwrite)")
    parser.add_argument("--csv", help="write the explanations here as a table for a spreadsheet, one line per row: "
                        "row, the row's columns the model does not read (e.g. applicant_id), prediction, target, "
                        "probabilities, valid, the changes in the row's units (and in the data spec's words), and why "
                        "a row was not explained (an existing file is refused unless --overwrite)")
    parser.add_argument("--letters", metavar="DIR", help="write a letter to each applicant into this folder: one "
                        "plain-text file per explained row (ID-1.txt by the rows' identifier, else row-1.txt) with the "
                        "decision, the changes that would change it and the facts held as they are, in the data "
                        "spec's words (label, unit, values); a folder holding files is refused unless --overwrite")


def add_explanation_limits(parser: argparse.ArgumentParser) -> None:
    """explain.py's options that ask more of an explanation than the model was trained with: ``--step``,
    ``--max-change`` and ``--target-order``."""
    parser.add_argument("--step", metavar="COLUMN=NUMBER,...", help="change these number or ordinal columns only by "
                        "whole steps from the row's own value, in their units or places of the order (e.g. "
                        "income=1000,grade=2), on top of the data spec's")
    parser.add_argument("--max-change", metavar="COLUMN=NUMBER,...", help="change these number or ordinal columns by "
                        "at most this much either way, in their units or places of the order (e.g. income=10000,"
                        "grade=2), on top of the data spec's")
    parser.add_argument("--target-order", metavar="LOWEST,...,HIGHEST",
                        help="the model's classes from lowest to highest (e.g. rejected,interview,offer): an "
                        "explanation towards a class is then valid where it reaches that class or a higher one, as "
                        "with target: {order: [...]} in the data spec, which a model trained without one lacks (the "
                        "order does not change training)")


def run_of_checkpoint(args: argparse.Namespace) -> None:
    """``--checkpoint runs:/ID/model`` (as evaluate.py takes it) read as ``--run-id ID``, which explain.py loads with
    its run's preprocessing and settings, said in a note; a registered model (``models:/NAME/VERSION``,
    ``models:/NAME@ALIAS``) read as ``--run-id`` of the same; another URI or both options refused in one line."""
    given = str(args.checkpoint or "")
    if ":/" not in given:
        return
    registered = is_registered_uri(given)
    if not registered and (not given.startswith("runs:/") or len(given.split("/")) < 2 or not given.split("/")[1]):
        raise InputError("--checkpoint", given, "a checkpoint file, runs:/RUN_ID/model, models:/NAME/VERSION, or "
                         "--run-id ID for a model of an MLflow run", "explain.py reads no other URI")
    if args.run_id:
        raise InputError("--checkpoint", given, "either --checkpoint or --run-id", f"--run-id {args.run_id} given too")
    if registered:  # the run that logged that version, with a note; an unknown one names the versions there are
        args.run_id, args.checkpoint = run_of_reference("--checkpoint", given, args.tracking_uri), None
        return
    args.run_id, args.checkpoint = given.split("/")[1], None
    print(f"note: --checkpoint {given} read as --run-id {args.run_id} (the run's model with its preprocessing)")


def run(args: argparse.Namespace) -> list[dict]:
    """Check the inputs, load the model, explain every row, print, write ``--json`` and ``--csv`` and log to the
    run."""
    with checking():
        run_of_checkpoint(args)
        check_output_file("--json", args.json, args.overwrite)
        check_output_file("--csv", getattr(args, "csv", None), args.overwrite)
        from ct_lightning.experiment.runs.letters import check_letters_folder, write_letters  # noqa: PLC0415

        check_letters_folder(getattr(args, "letters", None), args.overwrite)
        check_checkpoint_file("--checkpoint", args.checkpoint)
        if args.rows and not Path(table_file(args.rows)).is_file():  # a workbook's #sheet: read with the rows
            raise InputError("--rows", args.rows, TABLE_FILE,
                             f"file not found{path_hint(table_file(args.rows), '; {}')}")
        if args.run_id:  # models:/NAME/VERSION, as train.py prints it, is the run that logged that version
            args.run_id = run_of_reference("--run-id", args.run_id, args.tracking_uri)
            check_run_ids("--run-id", [args.run_id], args.tracking_uri)
        refused = run_write_refused(args.tracking_uri, args.run_id) if args.run_id and args.log else None
        if refused:  # a teammate's run, READ permission: explain all the same, and say where the results are
            print(not_logged(refused, args))
        if args.data:
            SETTINGS_BY_NAME["data"].checked(args.data, "--data")  # a table file must exist
        from ct_lightning.experiment.runs.explanations import (check_rows, explain_loaded,  # noqa: PLC0415
                                                               explanation_mutability, explanation_steps,
                                                               load_explainable, log_explanations, read_rows,
                                                               search_settings, use_data, use_target_order,
                                                               write_table)
        from ct_lightning.evaluation.explanation import class_text, describe, row_label  # noqa: PLC0415

        check_named_classes(args)
        rows = read_rows(args.rows, args.row)
        loaded = load_explainable(args.run_id, args.checkpoint, args.tracking_uri, args.which)
        replaced = use_data(loaded, args.data)
        if replaced:
            print(f"note: {replaced}")
        ordered = use_target_order(loaded, getattr(args, "target_order", None))
        if ordered:
            print(ordered)
        mutability = explanation_mutability(loaded, getattr(args, "immutable", None), getattr(args, "mutability", None))
        rows, notes, skipped = check_rows(rows, loaded, "--rows" if args.rows else "--row",
                                          skip_bad_rows=args.skip_bad_rows,
                                          held=[name for name, kind in mutability.items() if kind == "none"])
        for note in notes:
            print(f"note: {note}")
        others = rows.attrs.get("other_columns") or {}
        for row, problem in skipped:
            print(f"{row_label(row, others.get(row))}: not explained: {problem}")
        settings = search_settings(loaded.module, {k: getattr(args, k) for k in SEARCH})
        settings["mutability"] = mutability
        settings["steps"] = explanation_steps(loaded, getattr(args, "step", None), mutability=mutability)
        settings["max_changes"] = explanation_steps(loaded, getattr(args, "max_change", None), "max_change",
                                                    mutability)
        settings["fewer_changes"] = getattr(args, "fewer_changes", True)
        rows, passed, wanted = only_predicted(loaded, rows, getattr(args, "only_predicted", None))
        explanations = explain_loaded(loaded, rows, args.target, settings, args.seed) if len(rows) else \
            rows.iloc[:0, :0]  # no row is predicted as --only-predicted asks: nothing to search
    if len(explanations):
        print(describe(explanations))
    if len(explanations) and not any(len(fixed) for fixed in explanations["immutable"]):
        print("note: every column was free to change (the model was trained without immutable columns, and none was "
              "given): --immutable COLUMN,... holds those a person cannot change, e.g. age")
    # only where a valid explanation changes something: a row already predicted as its target is near no boundary
    changed = len(explanations) and any(v and len(c) for v, c in zip(explanations["valid"], explanations["changes"]))
    if args.tau is None and settings["tau"] <= 0.5 and changed:
        print(tau_note(settings["tau"], int(loaded.module.hparams.n_classes), bool(getattr(loaded.codec, "order", None))))
    elif len(explanations) and (short := short_of_tau_note(explanations, settings["tau"])):
        print(short)
    if skipped:
        print(f"{len(skipped)} of {len(skipped) + len(explanations) + len(passed)} rows not explained (listed above: "
              "--skip-bad-rows)")
    if wanted is not None:
        named = class_text(loaded.codec, wanted)  # in the data spec's words, the class in brackets
        print(f"--only-predicted {named}: {len(explanations)} of {len(explanations) + len(passed)} rows are "
              f"predicted {named} and explained"
              + ("; the other is not (its prediction is in --json and --csv)" if len(passed) == 1 else
                 f"; the {len(passed)} others are not (their predictions are in --json and --csv)" if passed else ""))
    records = numbered_records(explanations, skipped, others, passed, loaded.codec)
    comma = bool(getattr(loaded.codec, "decimal_comma", False))  # --csv in the training file's locale
    if args.json:
        write_json_atomic(args.json, records, readable=True)  # umlauts and € as the rows write them
    if getattr(args, "csv", None):
        write_table(args.csv, records, comma)
    if getattr(args, "letters", None):
        written = write_letters(args.letters, records, loaded.codec, args.overwrite)
        print(f"wrote {written} letter(s) to {args.letters}/ (one per explained row)")
    if args.run_id and args.log and not refused:
        try:
            folder = log_explanations(args.tracking_uri, args.run_id, explanations, records, comma)
        except Exception as error:
            if not is_permission_denied(error):
                raise
            print(not_logged(write_refused_now(args.tracking_uri, args.run_id), args))
        else:
            print(f"logged {folder}/ to run {args.run_id}")
    return records


def not_logged(reason: str, args: argparse.Namespace) -> str:
    """The one line on explanations the run's server does not take (``reason``): where they are instead."""
    kept = [f"--{name} {getattr(args, name)}" for name in ("json", "csv", "letters") if getattr(args, name, None)]
    where = f"printed here and written to {' and '.join(kept)}" if kept else \
        "printed here only (--json FILE or --csv FILE keeps them)"
    return f"note: the explanations are not logged to the run: {reason}; they are {where}; --no-log skips logging"


def tau_note(tau: float, n_classes: int, ordered: bool = False) -> str:
    """The note on a search that stops at the model's own low tau: the counterfactual is barely the target (of an
    ordered outcome: barely at least the target)."""
    if ordered:
        stop = (f"once the classes at or above the target reach tau {tau:g} together (the model's own) and one of "
                "them is the most likely")
    elif n_classes == 2:
        stop = f"once the target is the more likely class (tau {tau:g}, the model's own)"
    else:  # valid: the most likely of the classes, which may be below tau (0.43 of four classes)
        stop = (f"once the target's probability reaches tau {tau:g} (the model's own), and the change is valid once the "
                f"target is the most likely of the {n_classes} classes, perhaps below that")
    return (f"note: the search stops {stop}: such a change sits near a decision boundary; --tau 0.75 asks for one the "
            "model is surer of")


def short_of_tau_note(explanations, tau: float, most: int = 3) -> str | None:
    """The note on valid explanations whose target probability stays below ``tau`` (a ``--tau 0.75`` the search did
    not reach within its steps, the domain and what is held: ``0.74``), naming up to ``most`` rows; ``None`` where
    every valid one reaches it. Such a change is valid (the model predicts the target there), but less sure than
    asked, and the letters say the probability it reaches."""
    from ct_lightning.evaluation.explanation import probability_text, row_label  # noqa: PLC0415

    short = explanations[explanations["valid"] & (explanations["probability"] < tau - 5e-4)]
    if short.empty:
        return None
    named = [f"{row_label(i, row.get('other_columns'))}: {probability_text(row['probability'])}"
             for i, row in short.head(most).iterrows()]
    more = f", and {len(short) - most} more" if len(short) > most else ""
    return (f"note: {len(short)} of the {int(explanations['valid'].sum())} valid explanations "
            f"{'stays' if len(short) == 1 else 'stay'} below tau {tau:g} ({'; '.join(named)}{more}): the model "
            "predicts the target there, less surely than asked; more search steps (--max-steps) or a larger "
            "--search-lr may reach it")


def check_named_classes(args: argparse.Namespace) -> None:
    """``--only-predicted CLASS`` and ``--target CLASS`` that name no class of the model (by code or the data spec's
    words) refused before the rows are read and the model is built, from the classes its checkpoint or run keeps (a
    model of no table: refused once loaded, still before any search)."""
    given = {option: getattr(args, name, None) for option, name in (("--only-predicted", "only_predicted"),
                                                                    ("--target", "target"))}
    if all(label is None for label in given.values()):
        return
    from ct_lightning.evaluation.explanation import class_named  # noqa: PLC0415
    from ct_lightning.experiment.runs.explanations import known_classes  # noqa: PLC0415

    known = known_classes(args.run_id, args.checkpoint, args.tracking_uri)
    for option, label in given.items():
        if known and label is not None:
            class_named(label, known[0], option, known[1])


def only_predicted(loaded, rows, label) -> tuple:
    """``--only-predicted``: the rows the model predicts as the class ``label`` names (all rows when ``label`` is
    ``None``), ``(row, (prediction, its probability), why)`` for each other row, and that class. A label that is no
    class is a one-line error."""
    if label is None:
        return rows, [], None
    from ct_lightning.evaluation.explanation import class_named, class_text, predictions  # noqa: PLC0415

    wanted = class_named(label, list(loaded.codec.classes), "--only-predicted", getattr(loaded.codec, "class_labels",
                                                                                          None))
    predicted = predictions(loaded.module, rows, loaded.codec)
    keep = [p == wanted for p, _ in predicted]
    passed = [(row, p, f"predicted {class_text(loaded.codec, p[0])}, not {class_text(loaded.codec, wanted)} "
                       "(--only-predicted)")
              for row, p, kept in zip(rows.index, predicted, keep) if not kept]
    kept_rows = rows[keep]
    kept_rows.attrs = rows.attrs  # the rows' other columns and filled values, by row number
    return kept_rows, passed, wanted


def numbered_records(explanations, skipped: list[tuple[int, str]], others: dict | None = None,
                     passed: list[tuple[int, tuple[object, float], str]] = (), codec=None) -> list[dict]:
    """One JSON object per input row, in the input's order: ``row`` (its number in the input: from 1 where
    :func:`~ct_lightning.experiment.runs.explanations.read_rows` read them) and
    ``explained``; an explained row's explanation, a row left out (``--skip-bad-rows``) its ``problem``, a row of
    another prediction (``passed``, ``--only-predicted``) its ``prediction``, ``prediction_probability`` and why; each
    with ``other_columns``,
    the row's columns the model does not read (``others``: an applicant's id), where it has some; a ``prediction``
    with its ``prediction_label`` where the ``codec``'s data spec words the classes."""
    from ct_lightning.evaluation.explanation import _plain, class_wording, to_records  # noqa: PLC0415

    def other(row) -> dict:
        return {"other_columns": others[row]} if (others or {}).get(row) else {}

    records = [(int(row), {"row": int(row), "explained": True, **record})
               for row, record in zip(explanations.index, to_records(explanations))] if len(explanations) else []
    records += [(int(row), {"row": int(row), "explained": False, "problem": problem, **other(row)})
                for row, problem in skipped]
    records += [(int(row), {"row": int(row), "explained": False, "prediction": _plain(prediction),
                            **class_wording(codec, {"prediction": prediction}), "prediction_probability": probability,
                            "problem": why, **other(row)})
                for row, (prediction, probability), why in passed]
    return [record for _, record in sorted(records, key=lambda pair: pair[0])]
