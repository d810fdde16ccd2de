"""Train a classifier with counterfactual training (CT) and track it in MLflow.

Examples:
  python recipes/train.py                              # CT on the embedded circles data
  python recipes/train.py --data moons --objective vanilla --max-epochs 20
  python recipes/train.py --data ls --protect          # feature x1 immutable, as in the paper
  python recipes/train.py --data adult --immutable age --mutability hours_per_week=increase
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ct_lightning.constraints import MUTABILITY_KINDS  # noqa: E402
from ct_lightning.generators import GENERATORS  # noqa: E402
from ct_lightning.losses import OBJECTIVES  # noqa: E402
from ct_lightning.module import POOL_MODES  # noqa: E402
from ct_lightning.training import DEFAULTS, announce, train  # noqa: E402
from datamodules import available  # noqa: E402


def _csv_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/train.py``; unset options fall back to Table 2, then SPEC defaults."""
    d = DEFAULTS
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Options marked [Table 2] default to the data set's value in SPEC Table 2.")
    data = parser.add_argument_group("data")
    data.add_argument("--data", default=d["data"], help=f"data set: {', '.join(available())} (default %(default)s)")
    data.add_argument("--data-dir", help="folder with the raw data files (default: $CT_DATA_DIR, else the user cache)")
    data.add_argument("--batch-size", type=int, help="training batch size [Table 2]")
    data.add_argument("--seed", type=int, default=d["seed"], help="seed for model, shuffling and CT (default %(default)s)")

    ct = parser.add_argument_group("counterfactual training")
    ct.add_argument("--objective", default=d["objective"], choices=list(OBJECTIVES),
                    help="full: all terms; vanilla: baseline; energy: clf+div+ridge; adversarial: clf+adv (default %(default)s)")
    ct.add_argument("--max-epochs", type=int, default=d["max_epochs"], help="training epochs (default %(default)s)")
    ct.add_argument("--burnin", type=float, default=d["burnin"],
                    help="share of epochs trained conventionally before CT starts, in [0, 1) (default %(default)s)")
    ct.add_argument("--nce", type=int, help="counterfactuals searched per epoch [Table 2]")
    ct.add_argument("--pool", default=d["pool"], choices=POOL_MODES,
                    help="epoch: search all nce counterfactuals once per epoch (fast); step: search inside each step (default %(default)s)")
    ct.add_argument("--lambda-clf", type=float, default=d["lambda_clf"], help="weight of the classification loss (default %(default)s)")
    ct.add_argument("--lambda-div", type=float, default=d["lambda_div"], help="weight of the contrastive divergence (default %(default)s)")
    ct.add_argument("--lambda-reg", type=float, help=f"weight of the energy ridge penalty [Table 2] (SPEC default {d['lambda_reg']})")
    ct.add_argument("--lambda-adv", type=float, default=d["lambda_adv"], help="weight of the adversarial loss (default %(default)s)")
    ct.add_argument("--epsilon", type=float, default=d["epsilon"], help="ℓ∞ radius for nascent counterfactuals (default %(default)s)")

    search = parser.add_argument_group("counterfactual search")
    search.add_argument("--generator", default=d["generator"], choices=list(GENERATORS), help="default %(default)s")
    search.add_argument("--tau", type=float, help=f"target-probability threshold for convergence [Table 2] (SPEC default {d['tau']})")
    search.add_argument("--max-steps", type=int, default=d["max_steps"], help="maximum search steps T (default %(default)s)")
    search.add_argument("--search-lr", type=float, default=d["search_lr"], help="SGD step size η of the search (default %(default)s)")
    search.add_argument("--lambda-cost", type=float, default=d["lambda_cost"], help="ℓ1 distance penalty λ_cst (default %(default)s)")
    search.add_argument("--lambda-energy", type=float, default=d["lambda_energy"], help="ECCo energy penalty λ_egy (default %(default)s)")
    search.add_argument("--immutable", help="comma-separated feature names that must not change, e.g. age,sex")
    search.add_argument("--protect", action="store_true", help="make the data set's default protected features immutable")
    search.add_argument("--mutability", default="",
                        help=f"per-feature constraints FEATURE=KIND,... with KIND in {'|'.join(MUTABILITY_KINDS)}")
    search.add_argument("--no-domain", dest="domain", action="store_false", help="do not project counterfactuals onto the data domain")
    search.add_argument("--domain-std", type=float, default=d["domain_std"], help="n in the inferred domain μ ± nσ (default %(default)s)")

    model = parser.add_argument_group("model and optimiser")
    model.add_argument("--hidden-sizes", type=_csv_ints, default=d["hidden_sizes"], help="MLP hidden layer sizes, e.g. 64,64 (default 32)")
    model.add_argument("--activation", default=d["activation"], help="MLP activation (default %(default)s)")
    model.add_argument("--lr", type=float, default=d["lr"], help="Adam learning rate (default %(default)s)")
    model.add_argument("--accelerator", default=d["accelerator"], help="Lightning accelerator: auto, cpu, gpu (default %(default)s)")

    track = parser.add_argument_group("tracking and output")
    track.add_argument("--tracking-uri", default=d["tracking_uri"], help="MLflow tracking URI (default %(default)s)")
    track.add_argument("--experiment", default=d["experiment"], help="MLflow experiment name (default %(default)s)")
    track.add_argument("--run-name", help="MLflow run name")
    track.add_argument("--checkpoint-dir", help="checkpoint folder (default: checkpoints/RUN_ID beside a local SQLite store)")
    track.add_argument("--summary-json", help="write run id, resolved config, data summary and final metrics here")
    track.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    track.add_argument("--limit-train-batches", type=float, help="Lightning limit_train_batches (for quick runs)")
    track.add_argument("--limit-val-batches", type=float, help="Lightning limit_val_batches (for quick runs)")
    track.add_argument("--fast-dev-run", action="store_true", help="one batch of each loop, for smoke tests")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments, train, and print where to find the run."""
    args = vars(build_parser().parse_args(argv))
    for key in ("limit_train_batches", "limit_val_batches"):
        if args[key] is not None and float(args[key]).is_integer() and args[key] >= 1:
            args[key] = int(args[key])
    try:
        summary = train(args)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    print(announce(summary))
    return summary


if __name__ == "__main__":
    main()
