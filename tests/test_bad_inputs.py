"""Every recipe refuses bad input with one line naming the option, before anything is written.

Each case runs a recipe as a user would (``python recipes/X.py ...`` in a fresh folder, against a real
MLflow SQLite store). The first case of each recipe starts a fresh interpreter; the others run in a process
forked from one that has already imported torch, Lightning and MLflow (``tests/helpers/preloaded.py``: same
script, argv, environment, exit code and output; 0.1-1 s a case instead of 2-10 s). Each case checks: exit code 1 or 2, exactly one ``error:`` line that names the option (or
the file at fault), no traceback, and nothing half-written: no MLflow run in the store, no checkpoint
folder, no summary JSON, no store made in the working folder.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from preloaded import run_script

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "raw"
HAS_GPU = shutil.which("nvidia-smi") is not None

# (recipe, arguments, text the error line must hold, allowed exit codes). Placeholders: {tmp} (the case's
# folder), {store} (its tracking URI), {text} (a text file), {bad_yaml}, {yaml_ten}, {yaml_high}, {yaml_key},
# {yaml_no_val}, {other_sd} (weights of a 12-feature MLP), {other_ckpt} (a CTModule checkpoint of 5 features),
# {nan_dir}.
TRAIN = [
    ("--max-epochs -5", "--max-epochs"), ("--max-epochs 0", "--max-epochs"), ("--max-epochs -1", "--max-epochs"),
    ("--max-epochs ten", "--max-epochs"), ("--max-epochs 1.5", "--max-epochs"),
    ("--config {bad_yaml}", "--config"), ("--config {yaml_ten}", "max_epochs"), ("--config {yaml_high}", "tau"),
    ("--config {yaml_key}", "learning_rate"), ("--config {tmp}/missing.yaml", "--config"),
    ("--nce 0", "--nce"), ("--nce -10", "--nce"), ("--batch-size 0", "--batch-size"), ("--epsilon -1", "--epsilon"),
    ("--tau nan", "--tau"), ("--tau 0", "--tau"), ("--lr inf", "--lr"), ("--lambda-div nan", "--lambda-div"),
    ("--burnin 1.5", "--burnin"), ("--lr -1", "--lr"), ("--data nope", "--data"), ("--generator nope", "--generator"),
    ("--objective nope", "--objective"), ("--pool nope", "--pool"), ("--mutability x1=sideways", "--mutability: got 'x1=sideways' ('sideways' is no kind"),
    ("--mutability x1=increse", "--mutability: got 'x1=increse' ('increse' is no kind (did you mean 'increase'?), in"),
    ("--mutability x1", "--mutability"), ("--data moons --mutability nofeature=none", "--mutability"),
    ("--data moons --immutable nofeature", "--immutable"),
    # a feature given two kinds: one of them was silently dropped (train.py kept --immutable, explain.py --mutability)
    ("--data moons --mutability x1=increase,x1=decrease", "--mutability: got 'x1=increase,x1=decrease' ('x1' given "
                                                          "two kinds, increase and decrease); allowed: one kind"),
    ("--data moons --immutable x1 --mutability x1=increase", "--mutability: got 'x1=increase' ('x1' is also given as "
                                                             "immutable); allowed: x1=none, or 'x1' in only one"),
    ("--data {loans} --target approved --immutable age --mutability age=increase", "('age' is also given as immutable)"),
    # the data spec's kinds are facts about the data: the command line may hold them fixed, not loosen them
    ("--data {loans} --target approved --data-spec {facts_spec} --mutability sex=both",
     "--mutability: got 'sex=both' ('sex' is none in the data spec facts.yaml, a fact about the data that holds in "
     "every training and evaluation); allowed: sex=none, or change the data spec facts.yaml"),
    ("--data {loans} --target approved --data-spec {facts_spec} --mutability age=decrease",
     "('age' is increase in the data spec facts.yaml, a fact about the data that holds in every training and "
     "evaluation); allowed: age=increase or age=none, or change"),
    ("--data ls --protect --mutability x1=increase", "--mutability: got 'x1=increase' ('x1' is also protected: "
                                                     "--protect holds x1 fixed)"),
    ("--summary-json {text}/summary.json", "--summary-json"), ("--summary-json {tmp}", "--summary-json"),
    ("--checkpoint-dir {text}", "--checkpoint-dir"), ("--tracking-uri http://127.0.0.1:5999", "--tracking-uri"),
    ("--tracking-uri {tmp}/mlruns", "--tracking-uri: got"), ("--tracking-uri file:{tmp}/mlruns", "a folder store"),
    # a slip in a server's address: MLflow's traceback after the data were read, or a local folder store suggested
    ("--tracking-uri htp://127.0.0.1:5999", "--tracking-uri: got 'htp://127.0.0.1:5999' (unknown scheme 'htp'; did you "
                                            "mean http://127.0.0.1:5999?); allowed: http(s)://HOST:PORT"),
    ("--tracking-uri http//127.0.0.1:5999", "--tracking-uri: got 'http//127.0.0.1:5999' (did you mean "
                                            "http://127.0.0.1:5999?)"),
    ("--from-checkpoint {text}", "--from-checkpoint"), ("--from-checkpoint {tmp}/missing.ckpt", "--from-checkpoint"),
    # a misspelt path: the file it probably means ({other_typo}: other.ckpt as othr.ckpt, {loans_typo}: laons.csv)
    ("--from-checkpoint {other_typo}", "--from-checkpoint: no file at {other_typo} (did you mean '{other_ckpt}'?)"),
    ("--data {loans_typo} --target approved", "(file not found; did you mean '{loans}'?)"),
    ("--data moons --from-checkpoint {other_sd}", "--from-checkpoint"),
    ("--registered-model a/b", "--registered-model: got 'a/b'; allowed: a name of letters, digits"),
    ("--hidden-sizes 0", "--hidden-sizes"), ("--hidden-sizes a,b", "--hidden-sizes"), ("--seed -1", "--seed"),
    ("--model foo", "--model"), ("--activation nope", "--activation"), ("--generator-options {{bad", "--generator-options"),
    ("--generator ecco --generator-options nope=1", "--generator-options"),
    ("--limit-train-batches -1", "--limit-train-batches"), ("--eval-every -1", "--eval-every"),
    # a run that trains or validates nothing would log no val/acc (issue: a silently incomplete run)
    ("--limit-train-batches 0", "--limit-train-batches: got 0 (no --from-checkpoint: the run would log the untrained"),
    ("--limit-val-batches 0", "--limit-val-batches: got 0; allowed: a whole number of batches ≥ 1 or a share"),
    ("--limit-val-batches 0.0", "--limit-val-batches: got 0.0"),
    ("--limit-train-batches 1.5", "--limit-train-batches: got 1.5"),
    ("--config {yaml_no_val}", "limit_val_batches: got 0"),
    ("--data moons --limit-train-batches 0.001", "--limit-train-batches: got 0.001 (0.001 of 120 batches is none); "
                                                 "allowed: a share ≥ 1/120"),
    ("--data moons --limit-val-batches 0.5", "--limit-val-batches: got 0.5 (0.5 of 1 batch is none)"),
    ("--data-dir {text}", "--data-dir"), ("--data ch --data-dir {nan_dir}", "cal_housing.data"),
    ("--resume 0123456789abcdef --tracking-uri {empty_store}", "--resume"), ("--no-such-flag", "--no-such-flag"),
    ("--threads -1", "--threads"), ("--accelerator tpu9", "--accelerator"), ("--experiment ''", "--experiment"),
    ("--epoch-loop nope", "--epoch-loop"), ("--epoch-loop fused --fast-dev-run", "--epoch-loop"),
    ("--epoch-loop fused --limit-train-batches 3", "--epoch-loop"),
    # A user's table (issue 23 §1): each broken copy of tests/fixtures/loans.csv, made by bad_tables below.
    ("--data {bad_target} --target approved", "--target: column 'approved' not found"),
    # a class typed for the column (explain.py's --target is a class): say which column holds it
    ("--data {loans} --target yes", "--target: column 'yes' not found in {loans} ('yes' is a value of the column "
                                    "'approved': --target names the column to predict, --target approved); allowed:"),
    ("--data {bad_one_class} --target approved", "has only one class"),
    ("--data {bad_missing} --target approved", "column 'income' has 1 missing value(s)"),
    ("--data {bad_missing} --target approved --impute mean", "--impute"),
    ("--data {loans} --target approved --balance smote", "--balance: got 'smote'; allowed: one of none, undersample"),
    ("--data {bad_constant} --target approved", "column 'bank' is constant"),
    ("--data {bad_levels} --target approved", "categories; allowed: at most 100"),
    # a kind the data spec declares against the column's values: the option is --data-spec, not --data
    ("--data {bad_text} --target approved --data-spec {bad_text_spec}", "--data-spec: column 'income': kind "
                                                                        "'continuous', but the column holds "
                                                                        "non-numeric values such as 'unknown'"),
    ("--data {loans} --target approved --data-spec {binary_spec}", "--data-spec: column 'purpose': kind 'binary', but "
                                                                   "the column has 5 values (car, debt_consolidation"),
    # a yes/no spec on a file whose target holds a third class: trained as three classes without a word before
    # an identifier column the model was trained without: the one input too many, and the option that leaves it out
    ("--data {bad_with_id} --target approved --from-checkpoint {loans_sd}",
     "the model takes 13: leave the identifier 'applicant_id' out with --drop-columns applicant_id (13 inputs then), "
     "or, if it was trained on an encoding of your own"),
    # a two-class model on that file: the shapes alone (2.weight: checkpoint (2, 8) vs model (3, 8)) said no more
    ("--data {bad_three} --target approved --from-checkpoint {loans_sd}",
     "| the model has 2 outputs, the target 'approved' of three.csv has 3 classes (maybe: 10 row(s), no: "),
    *((f"--data {{bad_three}} --target approved --data-spec {{positive_spec}}{balance}",
       "--data-spec: positive: got 'yes' for a target of 3 classes (maybe: 10 row(s), no: ") for balance in
      ("", " --balance undersample")),
    ("--data {bad_empty} --target approved", "is empty"), ("--data {loans}", "--target"),
    ("--data {tmp}/missing.csv --target approved", "--data"), ("--data {loans} --target approved --immutable nope",
                                                               "--immutable"),
    ("--data {loans} --target approved --data-spec {tmp}/missing.yaml", "--data-spec"),
    ("--data {loans} --target approved --drop-columns ''", "--drop-columns: got ''"),  # typed, yet names nothing
    # --model-inputs: the inputs of a model of your own (bad_model_inputs below; {loans_sd}: a 13-input MLP)
    *((f"--data {{loans}} --target approved --from-checkpoint {{loans_sd}} --model-inputs {{inputs_{fault}}}", text)
      for fault, text in (("unknown_feature", "(input 1 of 13: unknown feature 'agee'; did you mean 'age'?); allowed: features of the table: "
                                              "age, income,"),
                          ("unknown_category", "unknown category 'renting' of 'home_ownership'); allowed: categories of "
                                               "home_ownership: mortgage, own, rent"),
                          ("category_of_number", "a category for the integer column 'age'"),
                          ("number_of_category", "a number (center, scale) for the categorical column 'purpose'"),
                          ("scale_zero", "(input 2 of 13 (income): scale 0); allowed: a number other than 0"),
                          ("width", "(it lists 12); allowed: a list of 13 inputs, one per input of the model's first "
                                    "layer"),
                          ("malformed", "not valid JSON"), ("not_a_list", "(a JSON dict, not a list)"),
                          ("bad_key", "unknown key 'mean'"), ("no_feature", "has no \"feature\""),
                          ("codes_missing", "no code for the category 'small_business' of 'purpose'"))),
    # "outputs" of --model-inputs (the object form): the classes of the model's outputs ({loans_sd1}: one output unit,
    # {loans_sd3}: three; {purpose_sd1}: one unit, 9 inputs, for --target purpose of 5 classes)
    *((f"--data {{loans}} --target approved --from-checkpoint {{{model}}} --model-inputs {{outputs_{fault}}}", text)
      for model, fault, text in (
          ("loans_sd", "unknown", '"outputs" ["no", "maybe"]: unknown class \'maybe\'); allowed: classes of the '
                                  "target: no, yes"),
          ("loans_sd", "repeated", '"outputs" ["yes", "yes"]: the class \'yes\' twice); allowed: "outputs": a list'),
          ("loans_sd", "one", '(\"outputs\" [\"yes\"]); allowed: "outputs": a list of the classes'),
          ("loans_sd", "key", "unknown key 'classes' of the object); allowed: the keys"),
          ("loans_sd3", "good", '"outputs" ["yes", "no"] lists 2 for a model of 3 outputs); allowed: one class per '
                                "output of the model"))),
    ("--data {loans} --target approved --from-checkpoint {loans_sd1} --model-inputs {inputs_good}",
     'one output unit and no "outputs" says which class it scores); allowed: the object {"inputs": [...], "outputs": '
     '[NEGATIVE, POSITIVE]}: add "outputs"'),
    ("--data {loans} --target approved --from-checkpoint {loans_sd1}", "one output unit (a single logit)"),
    ("--data {loans} --target purpose --from-checkpoint {purpose_sd1} --model-inputs {outputs_purpose}",
     '"outputs" ["car", "education"] for a model with one output unit on 5 classes); allowed: two classes'),
    ("--data {loans} --target approved --from-checkpoint {loans_sd} --model-inputs {tmp}/missing.json",
     "missing.json' (file not found); allowed: a JSON file listing the model's inputs"),
    ("--data moons --model-inputs {inputs_good}", "--model-inputs: got"),  # a data set has no table columns
    ("--config {yaml_inputs}", "model_inputs: got"),
]
if not HAS_GPU:
    TRAIN.append(("--accelerator gpu", "--accelerator"))
EVALUATE = [
    ("--checkpoint {text}", "--checkpoint"), ("--checkpoint {tmp}/missing.ckpt", "--checkpoint"),
    ("--run-id 0123456789abcdef --tracking-uri {empty_store}", "--run-id"),
    ("--run-id 0123456789abcdef --tracking-uri sqlite:///{tmp}/none/mlflow.db", "--tracking-uri"),
    ("--run-id 0123456789abcdef --tracking-uri htp://127.0.0.1:5999", "(unknown scheme 'htp'; did you mean http://"),
    ("--checkpoint {other_ckpt} --data moons", "--checkpoint"),
    ("--checkpoint {other_sd}", "--data"), ("--checkpoint {other_sd} --data {loans}", "--target"),
    # weights of another width: the shapes, and what to do, as train.py --from-checkpoint says it
    ("--checkpoint {other_sd} --data {loans} --target approved",
     "--checkpoint: got '{other_sd}' (the file does not fit the model: shape mismatch in 0.weight: checkpoint "
     "(32, 12) vs model (32, 13) | ct-lightning encodes loans.csv as 13 inputs"),
    ("--checkpoint {loans_sd} --data {bad_three} --target approved",
     "| the model has 2 outputs, the target 'approved' of three.csv has 3 classes (maybe: 10 row(s), no: "),
    ("--checkpoint {other_sd} --data {loans} --target nope", "target"),
    ("--checkpoint {other_sd} --data {tmp}/missing.csv --target approved", "--data"), ("--checkpoint {other_ckpt} --n-runs 0", "--n-runs"),
    ("--checkpoint {other_ckpt} --lambda-energy a,b", "--lambda-energy"),
    ("--checkpoint {other_ckpt} --protocol nope", "--protocol"), ("--checkpoint {other_ckpt} --eval-tau 0", "--eval-tau"),
    ("--checkpoint {other_ckpt} --summary-json {tmp}", "--summary-json"),
    ("--checkpoint {other_ckpt} --out-dir {text}", "--out-dir"), ("--checkpoint {other_ckpt} --data nope", "--data"),
    ("--n-runs 2", "--run-id"), ("--checkpoint {other_ckpt} --length-scale -1", "--length-scale"),
    ("--checkpoint {loans_sd} --data {loans} --target approved --model-inputs {inputs_unknown_category}",
     "--model-inputs: got"),
]
COMPARE = [
    # train.py's --mutability is no compare option: say where compare takes it from, not only "unrecognized"
    ("--data circles --mutability x1=increase", "unrecognized arguments: --mutability x1=increase; --mutability: "
                                                 "compare.py takes a table's increase/decrease-only columns from its "
                                                 "data spec"),
    ("--data circles --jobs 0", "--jobs"), ("--data nope", "--data"), ("--data circles --n-runs 0", "--n-runs"),
    ("--data circles --bl-run-id 0123456789abcdef --ct-run-id fedcba9876543210 --no-actionability "
     "--tracking-uri {empty_store}", "--bl-run-id"),
    ("--data circles --lambda-energy a,b", "--lambda-energy"), ("--data circles --protocol nope", "--protocol"),
    ("--data circles --confidence 1.5", "--confidence"), ("--data circles --max-epochs -5", "--max-epochs"),
    ("--data circles --out-dir {text}", "--out-dir"), ("--data circles --tracking-uri http://127.0.0.1:5999",
                                                       "--tracking-uri"),
    ("--data circles --tracking-uri htp://127.0.0.1:5999", "(unknown scheme 'htp'; did you mean http://"),
    ("--data circles,moons --bl-run-id a", "--bl-run-id"), ("--data circles --threads x", "--threads"),
    ("--data circles --seeds 0,x", "--seeds"), ("--data circles --seeds 0,0", "--seeds"),
    ("--data circles --seeds 0,1 --n-seeds 2", "--n-seeds"), ("--data circles --n-seeds 0", "--n-seeds"),
    ("--data circles --n-seeds 2 --bl-run-id 0123456789abcdef", "--bl-run-id"),
    ("--data {loans}", "--target"), ("--data {loans} --target approved", "--immutable"),  # no protected columns
    ("--data {loans} --target approved --immutable age --no-actionability", "--immutable"),
    ("--data circles --target approved", "--target"), ("--data {tmp}/missing.csv --target approved", "--data"),
    ("--data {bad_missing} --target approved --no-actionability", "column 'income' has 1 missing value(s)"),
    ("--data circles --limit-train-batches 0", "--limit-train-batches: got 0 (this recipe trains its models from"),
]
if not HAS_GPU:
    EVALUATE.append(("--checkpoint {other_ckpt} --accelerator gpu", "--accelerator"))
    COMPARE.append(("--data circles --accelerator gpu", "--accelerator"))
CONSISTENCY = [
    ("--n-models 0", "--n-models"), ("--mode nope", "--mode"), ("--kinds XX", "--kinds"), ("--tau 1.5", "--tau"),
    ("--data nope", "--data"), ("--max-epochs 0", "--max-epochs"), ("--summary-json {tmp}", "--summary-json"),
    ("--limit-train-batches 0", "--limit-train-batches: got 0 (this recipe trains its models from scratch"),
    ("--summary-json {text}", "(the file exists); allowed: a new file path, or --overwrite to replace this one"),
]
TRAIN_GENERATOR = [
    ("--max-epochs 3", "--run-id"), ("--checkpoint {text}", "--checkpoint"), ("--checkpoint {text} --max-epochs 0",
                                                                              "--max-epochs"),
    ("--checkpoint {text} --variant nope", "--variant"), ("--checkpoint {text} --lr -1", "--lr"),
    ("--run-id 0123456789abcdef --tracking-uri {empty_store}", "--run-id"),
    ("--checkpoint {text} --baseline nope", "--baseline"),
    ("--checkpoint {text} --summary-json {text}", "(the file exists); allowed: a new file path, or --overwrite"),
]
ROW5 = '\'{{"x1": 0.1, "x2": 0, "x3": 1, "x4": -1, "x5": 2}}\''  # a row of {other_ckpt}'s 5 unnamed features
EXPLAIN = [
    # train.py's options for a model of your own: say how to log it as it is, not only "unrecognized"
    ("--checkpoint {loans_sd} --data {loans} --model-inputs {inputs_good} --row " + ROW5,
     "unrecognized arguments: --model-inputs {inputs_good}; --model-inputs: explain.py explains a model that train.py "
     "logged, which carries its inputs, outputs and data spec: log yours as it is with train.py"),
    ("--checkpoint {other_ckpt} --data-spec {facts_spec} --row " + ROW5,
     "--data-spec: the model's data spec comes with it (train.py --data-spec); here --immutable"),
    ("--checkpoint {other_ckpt}", "--rows --row"), ("--row " + ROW5, "--run-id --checkpoint"),
    ("--checkpoint {text} --row " + ROW5, "--checkpoint"), ("--checkpoint {tmp}/missing.ckpt --row " + ROW5, "--checkpoint"),
    ("--checkpoint {other_typo} --row " + ROW5, "(did you mean '{other_ckpt}'?)"),
    ("--checkpoint {other_sd} --row " + ROW5, "--checkpoint: got"),  # weights only: no settings of a training
    ("--run-id 0123456789abcdef --tracking-uri {empty_store} --row " + ROW5, "--run-id"),
    ("--run-id 0123456789abcdef --tracking-uri htp://127.0.0.1:5999 --row " + ROW5, "(unknown scheme 'htp'; did you"),
    ("--checkpoint {other_ckpt} --row nope", "--row"), ("--checkpoint {other_ckpt} --row '[]'", "--row"),
    ("--checkpoint {other_ckpt} --row '{{\"age\": 53}}'", "--row"),  # unknown column (no preprocessing: x1..x5)
    ("--checkpoint {other_ckpt} --row '{{\"x1\": 0.1}}'", "--row"),  # missing columns
    ("--checkpoint {other_ckpt} --row '{{\"x1\": \"abc\", \"x2\": 0, \"x3\": 1, \"x4\": -1, \"x5\": 2}}'",
     "--row"),
    ("--checkpoint {other_ckpt} --rows {tmp}/missing.csv", "--rows: got '{tmp}/missing.csv' (file not found); allowed: "
     "a .csv/.tsv/.txt/.parquet/.xlsx/.xlsm file"),
    ("--checkpoint {other_ckpt} --rows {loans_typo}", "--rows: got '{loans_typo}' (file not found; did you mean '{loans}'?)"), ("--checkpoint {other_ckpt} --rows {text}", "--rows"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --target 7", "--target"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --generator nope", "--generator"),
    # a generator that learns from the training data, and a checkpoint without the config.json naming that data
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --generator revise", "--generator: got 'revise'"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --data {tmp}/missing.csv", "--data"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --generator revise --data moons",  # data of another model
     "--data: got 'moons' (its model takes 5 features: trained on another data set?)"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --tau 0", "--tau"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --json {text}", "--json: got"),  # exists: only with --overwrite
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --max-steps -1", "--max-steps"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --json {tmp}", "--json"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --immutable age", "--immutable: got 'age' (no such column)"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --mutability x9=none", "--mutability: got 'x9' (no such column)"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --mutability x1", "--mutability: got 'x1'"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --mutability x1=increase,x1=none",
     "--mutability: got 'x1=increase,x1=none' ('x1' given two kinds, increase and none); allowed: one kind"),
    ("--checkpoint {other_ckpt} --row " + ROW5 + " --immutable x1 --mutability x1=decrease",
     "--mutability: got 'x1=decrease' ('x1' is also given as immutable); allowed: x1=none, or 'x1' in only one"),
]
APPENDIX = [
    ("--grid note9 --data credit", "raw file 'UCI_Credit_Card.csv' not found"),  # $CT_DATA_DIR is an empty folder
    ("--grid nope", "--grid"), ("--grid note9 --data nope", "--data"), ("--grid note5 --stack 0", "--stack"),
    ("--grid all --data nope", "--data"),  # the whole study: the error lists the nine sets of its grids
]
SWEEP = [  # refused before the first trial, not by every trial (recipes/sweep.py adds --executor local --param nce=16,32)
    ("--summary-json {tmp}/s.json", "--sweep-json"), ("--resume", "re-run the same sweep command"),
    ("--metric val/accuracy", "--metric: got 'val/accuracy'"), ("--metric val/ip", "only with --eval-every"),
    ("--data {loans} --target approved --immutable AGE", "--immutable: got 'AGE' (unknown feature; did you mean 'age'? names are case-sensitive)"),
    ("--data {loans} --target nope", "--target"),
    ("--limit-val-batches 0", "--limit-val-batches: got 0"),
    ("--param limit_train_batches=2,0", "limit-train-batches: got 0 (no --from-checkpoint"),
    # refused before the first trial (each trial used to fail on them, or the sweep after its trials)
    ("--from-checkpoint {tmp}/missing.ckpt", "--from-checkpoint"), ("--config {tmp}/missing.yaml", "--config"),
    ("--sweep-json {text}/sweep.json", "--sweep-json"), ("--checkpoint-dir {text}", "--checkpoint-dir"),
    ("--param accelerator=cpu,gpu", "--param: got 'accelerator=cpu,gpu' (accelerator does not change the trained"),
]
CASES = [("sweep", *c) for c in SWEEP] + [("train", *c) for c in TRAIN] + [("evaluate", *c) for c in EVALUATE] + [("compare", *c) for c in COMPARE] \
    + [("consistency", *c) for c in CONSISTENCY] + [("train_generator", *c) for c in TRAIN_GENERATOR] \
    + [("explain", *c) for c in EXPLAIN] + [("appendix", *c) for c in APPENDIX]


FRESH = {recipe: next(i for i, case in enumerate(CASES) if case[0] == recipe) for recipe, *_ in CASES}


def test_at_least_fifty_cases():
    assert len(CASES) >= 50


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Files the cases point at: text, bad YAML, checkpoints of another data set, a data file with a NaN, a store."""
    import torch

    from ct_lightning.models import build_mlp
    from ct_lightning.module import CTModule

    base = tmp_path_factory.mktemp("inputs")
    (base / "notes.txt").write_text("not a checkpoint\n")
    (base / "bad.yaml").write_text("max_epochs: [1, 2\ntau: : :\n")
    (base / "ten.yaml").write_text('max_epochs: "ten"\n')
    (base / "high.yaml").write_text('tau: "high"\n')
    (base / "key.yaml").write_text("learning_rate: 0.1\n")
    (base / "no_val.yaml").write_text("limit_val_batches: 0\n")
    torch.save({"state_dict": build_mlp(12, 2, [32]).state_dict()}, base / "adult_mlp.pt")
    module = CTModule(n_features=5, n_classes=2)
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": "2.0.0"}, base / "other.ckpt")
    nan_dir = base / "raw" / "california_housing"
    nan_dir.mkdir(parents=True)
    lines = (FIXTURES / "california_housing" / "cal_housing.data").read_text().splitlines()
    lines[2] = "nan," + lines[2].split(",", 1)[1]
    (nan_dir / "cal_housing.data").write_text("\n".join(lines) + "\n")
    from mlflow.tracking import MlflowClient

    (base / "store").mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{base / 'store' / 'mlflow.db'}").create_experiment("ct-lightning")
    tables = bad_tables(base)
    torch.save(build_mlp(13, 2, [8]).state_dict(), base / "loans_mlp.pt")  # 13 inputs: the loans fixture's width
    torch.save(build_mlp(13, 1, [8]).state_dict(), base / "loans_mlp1.pt")  # a single logit (BCEWithLogitsLoss)
    torch.save(build_mlp(13, 3, [8]).state_dict(), base / "loans_mlp3.pt")
    torch.save(build_mlp(9, 1, [8]).state_dict(), base / "purpose_mlp1.pt")  # --target purpose: 9 inputs
    (base / "inputs.yaml").write_text("model_inputs: 3\n")
    return {**tables, **bad_model_inputs(base), "loans_sd": str(base / "loans_mlp.pt"),
            "loans_sd1": str(base / "loans_mlp1.pt"), "loans_sd3": str(base / "loans_mlp3.pt"),
            "purpose_sd1": str(base / "purpose_mlp1.pt"),
            "yaml_inputs": str(base / "inputs.yaml"), "text": str(base / "notes.txt"), "bad_yaml": str(base / "bad.yaml"), "yaml_ten": str(base / "ten.yaml"),
            "yaml_high": str(base / "high.yaml"), "yaml_key": str(base / "key.yaml"),
            "yaml_no_val": str(base / "no_val.yaml"),
            "other_sd": str(base / "adult_mlp.pt"), "other_ckpt": str(base / "other.ckpt"),
            "other_typo": str(base / "othr.ckpt"), "loans_typo": str(ROOT / "tests" / "fixtures" / "laons.csv"),
            "nan_dir": str(base / "raw"), "loans": str(ROOT / "tests" / "fixtures" / "loans.csv"),
            "empty_db": str(base / "store" / "mlflow.db")}


def bad_tables(folder: Path) -> dict[str, str]:
    """Broken copies of the loans fixture, one fault each: ``bad_<fault>`` -> its path."""
    import numpy as np
    import pandas as pd

    loans = pd.read_csv(ROOT / "tests" / "fixtures" / "loans.csv")
    broken = {"target": loans.drop(columns="approved"), "one_class": loans.assign(approved="yes"),
              "missing": loans.copy(), "constant": loans.assign(bank="same"),
              "levels": loans.assign(applicant_id=[f"id{i}" for i in range(len(loans))]),
              "text": loans.assign(income=loans["income"].astype(str)), "three": loans.copy(),
              "with_id": loans.assign(applicant_id=range(1001, 1001 + len(loans)))}
    broken["three"].loc[:9, "approved"] = "maybe"
    broken["missing"].loc[3, "income"] = np.nan
    broken["text"].loc[5, "income"] = "unknown"
    paths = {}
    for fault, frame in broken.items():
        frame.to_csv(folder / f"{fault}.csv", index=False)
        paths[f"bad_{fault}"] = str(folder / f"{fault}.csv")
    (folder / "empty.csv").write_text("")
    (folder / "spec.yaml").write_text("columns:\n  income: {kind: continuous}\n")
    (folder / "facts.yaml").write_text("columns:\n  age: {mutability: increase}\n  sex: {mutability: none}\n")
    (folder / "positive.yaml").write_text("positive: 'yes'\ncolumns:\n  age: {mutability: none}\n")
    (folder / "binary.yaml").write_text("columns:\n  purpose: {kind: binary}\n")
    return {**paths, "bad_empty": str(folder / "empty.csv"), "bad_text_spec": str(folder / "spec.yaml"),
            "facts_spec": str(folder / "facts.yaml"), "positive_spec": str(folder / "positive.yaml"),
            "binary_spec": str(folder / "binary.yaml")}


def bad_model_inputs(folder: Path) -> dict[str, str]:
    """``--model-inputs`` files for the loans fixture, one fault each: ``inputs_<fault>`` -> its path (and a good one,
    ``inputs_good``)."""
    import json

    good = [{"feature": name, "center": 0, "scale": 1} for name in ("age", "income", "debt", "years_employed")]
    good += [{"feature": "home_ownership", "category": c} for c in ("mortgage", "own", "rent")]
    good += [{"feature": "purpose", "category": c} for c in ("car", "debt_consolidation", "education",
                                                            "home_improvement", "small_business")]
    good += [{"feature": "sex", "category": "male"}]
    faults = {"good": good, "unknown_feature": [{**good[0], "feature": "agee"}, *good[1:]],
              "unknown_category": [*good[:6], {"feature": "home_ownership", "category": "renting"}, *good[7:]],
              "category_of_number": [{"feature": "age", "category": "old"}, *good[1:]],
              "number_of_category": [*good[:7], {"feature": "purpose", "center": 0, "scale": 1}, *good[8:]],
              "scale_zero": [good[0], {**good[1], "scale": 0}, *good[2:]], "width": good[:12],
              "not_a_list": {"age": 1}, "bad_key": [{"feature": "age", "mean": 3}, *good[1:]],
              "no_feature": [{"center": 0, "scale": 1}, *good[1:]],
              "codes_missing": [*good[:12], {"feature": "purpose", "codes": {"car": 0, "debt_consolidation": 1,
                                                                            "education": 2, "home_improvement": 3}}]}
    purpose = [*good[:7], good[-1], {"feature": "approved", "category": "yes"}]  # --target purpose: 9 inputs
    outputs = {"unknown": {"inputs": good, "outputs": ["no", "maybe"]},
               "repeated": {"inputs": good, "outputs": ["yes", "yes"]},
               "one": {"inputs": good, "outputs": ["yes"]}, "key": {"inputs": good, "classes": ["no", "yes"]},
               "good": {"inputs": good, "outputs": ["yes", "no"]},
               "purpose": {"inputs": purpose, "outputs": ["car", "education"]}}
    paths = {}
    for fault, content in faults.items():
        (folder / f"inputs_{fault}.json").write_text(json.dumps(content))
        paths[f"inputs_{fault}"] = str(folder / f"inputs_{fault}.json")
    for fault, content in outputs.items():
        (folder / f"outputs_{fault}.json").write_text(json.dumps(content))
        paths[f"outputs_{fault}"] = str(folder / f"outputs_{fault}.json")
    (folder / "inputs_malformed.json").write_text('[{"feature": "age",]')
    return {**paths, "inputs_malformed": str(folder / "inputs_malformed.json")}


def _runs(database: Path) -> list[tuple]:
    if not database.is_file():
        return []
    with sqlite3.connect(database) as connection:
        tables = {row[0] for row in connection.execute("select name from sqlite_master where type='table'")}
        return list(connection.execute("select run_uuid, status from runs")) if "runs" in tables else []


@pytest.mark.parametrize("recipe, arguments, names, fresh", [(r, a, n, FRESH[r] == i) for i, (r, a, n) in enumerate(CASES)],
                         ids=[f"{r}:{a[:60]}" for r, a, _ in CASES])
def test_bad_input_is_refused_in_one_line_before_any_work(recipe, arguments, names, fresh, inputs, tmp_path):
    import shlex

    work = tmp_path / "work"
    work.mkdir()
    store = tmp_path / "store"
    store.mkdir()
    empty_store = tmp_path / "empty"
    empty_store.mkdir()
    shutil.copy(inputs["empty_db"], empty_store / "mlflow.db")
    values = {**inputs, "tmp": str(tmp_path), "store": f"sqlite:///{store / 'mlflow.db'}",
              "empty_store": f"sqlite:///{empty_store / 'mlflow.db'}"}
    argv = shlex.split(arguments.format(**values))
    if "--tracking-uri" not in argv and recipe != "evaluate":
        argv += ["--tracking-uri", values["store"]]
    summary = tmp_path / "out" / "summary.json"
    if recipe in ("train", "consistency", "train_generator") and "--summary-json" not in argv:
        argv += ["--summary-json", str(summary)]
    if recipe == "sweep":
        argv += ["--executor", "local", "--param", "nce=16,32", "--max-epochs", "1"]
    if recipe in ("compare", "appendix") and "--out-dir" not in argv:
        argv += ["--out-dir", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CT_CACHE_DIR": str(tmp_path / "cache"),
           "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore", "CT_DATA_DIR": str(tmp_path / "no-raw-data"),
           "CT_OFFLINE": "1"}
    script = ROOT / "recipes" / f"{recipe}.py"
    if fresh:
        done = subprocess.run([sys.executable, str(script), *argv], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
    else:
        done = run_script(script, argv, cwd=work, env=env, timeout=300)
    output = done.stdout + done.stderr
    if os.environ.get("CT_BAD_INPUTS_REPORT"):  # the list of inputs and answers for the issue note
        with open(os.environ["CT_BAD_INPUTS_REPORT"], "a") as report:
            last = (done.stderr.strip().splitlines() or [""])[-1]
            report.write(f"| {recipe} | `{arguments}` | {done.returncode} | `{last}` |\n")
    assert done.returncode in (1, 2), f"exit code {done.returncode}:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"expected one error line:\n{output[-3000:]}"
    assert done.stderr.strip().splitlines()[-1] == errors[0], "the error is the last line"
    names = re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), names)  # the case's file paths
    assert names in errors[0], f"{names!r} not named in {errors[0]!r}"
    for database in (store / "mlflow.db", empty_store / "mlflow.db"):
        assert _runs(database) == [], f"runs left in the store: {_runs(database)}"
    assert not (store / "checkpoints").exists() and not (empty_store / "checkpoints").exists()
    assert not summary.exists() and not (tmp_path / "out" / "summary.json").exists()
    assert not (work / "mlruns").exists(), "a store was made in the working folder"
    assert not list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else True


def test_a_config_with_a_key_written_twice_is_refused_with_its_line(tmp_path):
    # PyYAML keeps the last of two equal keys: a config saying max_epochs twice trained with the second silently
    from ct_lightning.experiment.configuration.settings import load_config_file

    config = tmp_path / "run.yaml"
    config.write_text("max_epochs: 50\ntau: 0.9\nmax_epochs: 5\n")
    with pytest.raises(Exception) as error:
        load_config_file(config)
    assert "not valid YAML: line 3, column 1: found 'max_epochs' twice (a key may be written once)" in str(error.value)


@pytest.mark.parametrize("arguments", [["--target", "aproved"], ["--target", "approved", "--immutable", "agee"]])
def test_a_misspelt_column_is_refused_before_the_start_up_lines(arguments, tmp_path):
    """A column name the table's header line does not hold is refused before ``MLflow store:`` and ``CPU math:``
    are printed (they came first, as if the training had started)."""
    loans = ROOT / "tests" / "fixtures" / "loans.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": ""}
    done = run_script(ROOT / "recipes" / "train.py", ["--data", str(loans), *arguments], cwd=tmp_path, env=env)
    assert done.returncode == 2 and done.stderr.startswith("error: --"), done.stderr[-2000:]
    assert done.stdout == "", done.stdout
