"""Send a run's outbox to its tracking server after an outage, and end the run (see :mod:`.outbox`).

Usage::

    python -m ct_lightning.experiment.runs.upload FOLDER [--tracking-uri URI]

``FOLDER``: the run's ``mlflow-outbox`` folder, or the checkpoint folder that holds it (the training names
the command to run when it ends with records left). ``--tracking-uri``: the server, if it moved since.
Running it again sends nothing twice.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ct_lightning.experiment.runs.outbox import OUTBOX_DIR, Outbox, replay


def finish_deferred_end(client, record: dict, outbox: Outbox, tracking_uri: str | None = None) -> dict:
    """Complete a training whose end found the server down: rebuild its model from the kept final weights,
    log the models and the plots as the training would have, and end the run FINISHED. Returns the logged
    models (:func:`~ct_lightning.experiment.runs.served_model.log_models`: the registered name and version)."""
    import torch

    from ct_lightning.experiment.configuration.data import build_datamodule, mutability_spec
    from ct_lightning.experiment.runs.run_artifacts import log_training_plots
    from ct_lightning.experiment.runs.served_model import log_models
    from ct_lightning.experiment.configuration.settings import DEFAULTS
    from ct_lightning.experiment.runs.train import build_module

    config = {**DEFAULTS, **record["config"]}
    datamodule = build_datamodule(config)
    state = torch.load(outbox.folder / record["state"], map_location="cpu", weights_only=True)
    module = build_module(config, datamodule, state)  # its network's last layer: one output unit or more
    codec = getattr(datamodule, "codec", None)
    if codec is not None:
        module.preprocessing = codec.to_dict()
    module.load_state_dict(state)
    run_id = record["run_id"]
    models = log_models(client, tracking_uri or record["tracking_uri"], record["experiment_id"], run_id, module,
                        datamodule, config, record["metrics"], mutability_spec(config, datamodule) or None)
    log_training_plots(client, run_id, module, datamodule)
    client.set_terminated(run_id, "FINISHED")
    return models


def find_outbox(folder: str | Path) -> Outbox:
    """The outbox at ``folder`` or in its ``mlflow-outbox`` subfolder; a one-line ``ValueError`` if neither."""
    folder = Path(folder)
    for candidate in (folder, folder / OUTBOX_DIR):
        if (candidate / "journal.jsonl").is_file():
            return Outbox(candidate)
    raise ValueError(f"FOLDER: no outbox (journal.jsonl) in {folder} or {folder / OUTBOX_DIR}")


def upload(folder: str | Path, tracking_uri: str | None = None, echo=print) -> dict:
    """Send the outbox's unsent records (finishing a deferred end) and return ``{"run_id", "sent", "status"}``."""
    from mlflow.tracking import MlflowClient

    from ct_lightning.experiment.configuration.store import check_tracking_reachable
    from ct_lightning.experiment.runs.tracking_server import is_outage, is_server_uri, server_run_url
    from ct_lightning.experiment.runs.train import registered_lines
    from ct_lightning.experiment.configuration.validation import EnvironmentProblem

    outbox = find_outbox(folder)
    about = outbox.about()
    uri = tracking_uri or about.get("tracking_uri")
    if not uri:
        raise ValueError(f"--tracking-uri: {outbox.folder} does not say which server its run is on; pass it")
    check_tracking_reachable(uri)
    client = MlflowClient(tracking_uri=uri)
    waiting = len(outbox.pending())
    ended = []  # the models a deferred end logged, to name the registered predictor as train.py does
    try:
        sent = replay(client, outbox, end=lambda c, record, box: ended.append(finish_deferred_end(c, record, box, uri)))
    except Exception as error:
        if not is_outage(error):
            raise
        raise EnvironmentProblem(f"tracking server {uri} went away during the upload "
                                 f"({str(error).splitlines()[0][:200]}); what was sent stays counted, run the "
                                 f"same command again when it answers") from None
    run_id = about.get("run_id") or next((r["run_id"] for r in outbox.records() if r.get("run_id")), None)
    run = client.get_run(run_id)
    echo(f"run {run_id}: {sent} of {waiting} waiting record(s) sent to {uri}; the run is {run.info.status}",
         flush=True)
    for line in registered_lines({"models": ended[-1] if ended else None, "tracking_uri": uri}):
        echo(line, flush=True)
    if is_server_uri(uri):
        echo(f"Open the run in the server's UI:  {server_run_url(uri, run.info.experiment_id, run_id)}", flush=True)
    return {"run_id": run_id, "sent": sent, "status": run.info.status}


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line and upload; a bad folder or an unreachable server ends with a one-line error."""
    from ct_lightning.experiment.configuration.validation import KNOWN_ERRORS, Parser, exit_on_error

    parser = Parser(prog="python -m ct_lightning.experiment.runs.upload", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", metavar="FOLDER", help="the run's mlflow-outbox folder (or its checkpoint folder)")
    parser.add_argument("--tracking-uri", default=None, help="the tracking server, if not the one the run used")
    args = parser.parse_args(argv)
    try:
        return upload(args.folder, args.tracking_uri)
    except KNOWN_ERRORS as error:
        exit_on_error(error, parser)


if __name__ == "__main__":
    main()
    sys.exit(0)
