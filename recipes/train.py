"""Train a classifier with counterfactual training (CT) and track it in MLflow.

Examples:
  python recipes/train.py                              # CT on the embedded circles data
  python recipes/train.py --data moons --objective vanilla --max-epochs 20
  python recipes/train.py --data ls --protect          # feature x1 immutable, as in the paper
  python recipes/train.py --data adult --immutable age --mutability hours_per_week=increase
  python recipes/train.py --config configs/adult.yaml --max-epochs 10
  python recipes/train.py --data moons --from-checkpoint vanilla.ckpt --max-epochs 50   # fine-tune with CT
  python recipes/train.py --resume                     # continue the newest interrupted run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path.cwd()))  # so that --model my_models:factory finds the user's own module

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
        argument_default=argparse.SUPPRESS,  # only what the command line gives overrides the config file
        epilog="Precedence: SPEC defaults < the data set's Table 2 values [Table 2] < --config file < command line.")
    parser.add_argument("--config", help="YAML file with any of these options (long names, e.g. max_epochs: 50)")
    data = parser.add_argument_group("data")
    data.add_argument("--data", help=f"data set: {', '.join(available())} (default {DEFAULTS['data']})")
    data.add_argument("--data-dir", help="folder with the raw data files (default: $CT_DATA_DIR, else the user cache)")
    data.add_argument("--batch-size", type=int, help="training batch size [Table 2]")
    data.add_argument("--seed", type=int, help="seed for model, shuffling and CT (default {DFLT})")

    ct = parser.add_argument_group("counterfactual training")
    ct.add_argument("--objective", choices=list(OBJECTIVES),
                    help="full: all terms; vanilla: baseline; energy: clf+div+ridge; adversarial: clf+adv (default {DFLT})")
    ct.add_argument("--max-epochs", type=int, help="training epochs (default {DFLT})")
    ct.add_argument("--burnin", type=float,
                    help="share of epochs trained conventionally before CT starts, in [0, 1) (default {DFLT})")
    ct.add_argument("--nce", type=int, help="counterfactuals searched per epoch [Table 2]")
    ct.add_argument("--pool", choices=POOL_MODES,
                    help="epoch: search all nce counterfactuals once per epoch (fast); step: search inside each step (default {DFLT})")
    ct.add_argument("--lambda-clf", type=float, help="weight of the classification loss (default {DFLT})")
    ct.add_argument("--lambda-div", type=float, help="weight of the contrastive divergence (default {DFLT})")
    ct.add_argument("--lambda-reg", type=float, help=f"weight of the energy ridge penalty [Table 2] (SPEC default {d['lambda_reg']})")
    ct.add_argument("--lambda-adv", type=float, help="weight of the adversarial loss (default {DFLT})")
    ct.add_argument("--epsilon", type=float, help="ℓ∞ radius for nascent counterfactuals (default {DFLT})")

    search = parser.add_argument_group("counterfactual search")
    search.add_argument("--generator", choices=list(GENERATORS), help="default {DFLT}")
    search.add_argument("--generator-options", metavar="OPTIONS",
                        help="generator settings as KEY=VALUE,... or a JSON object, e.g. variant=gan,refit_every=5 "
                             "(amortised) or latent_dim=4 (revise)")
    search.add_argument("--tau", type=float, help=f"target-probability threshold for convergence [Table 2] (SPEC default {d['tau']})")
    search.add_argument("--max-steps", type=int, help="maximum search steps T (default {DFLT})")
    search.add_argument("--search-lr", type=float, help="SGD step size η of the search (default {DFLT})")
    search.add_argument("--lambda-cost", type=float, help="ℓ1 distance penalty λ_cst (default {DFLT})")
    search.add_argument("--lambda-energy", type=float, help="ECCo energy penalty λ_egy (default {DFLT})")
    search.add_argument("--immutable", help="comma-separated feature names that must not change, e.g. age,sex")
    search.add_argument("--protect", action="store_true", help="make the data set's default protected features immutable")
    search.add_argument("--mutability",
                        help=f"per-feature constraints FEATURE=KIND,... with KIND in {'|'.join(MUTABILITY_KINDS)}")
    search.add_argument("--no-domain", dest="domain", action="store_false", help="do not project counterfactuals onto the data domain")
    search.add_argument("--domain-std", type=float, help="n in the inferred domain μ ± nσ (default {DFLT})")

    model = parser.add_argument_group("model and optimiser")
    model.add_argument("--model", help="mlp, cnn (LeNet-style, for MNIST) or package.module:factory returning an "
                                       "nn.Module (called with n_features, n_classes if it takes them) (default {DFLT})")
    model.add_argument("--hidden-sizes", type=_csv_ints, help="MLP hidden layer sizes, e.g. 64,64 (default 32)")
    model.add_argument("--activation", help="MLP activation (default {DFLT})")
    model.add_argument("--lr", type=float, help="Adam learning rate (default {DFLT})")
    model.add_argument("--accelerator", help="Lightning accelerator: auto, cpu, gpu (default {DFLT})")

    start = parser.add_argument_group("fine-tuning and resuming")
    start.add_argument("--from-checkpoint", help="start from these weights: a checkpoint of this project, a "
                                                 "state_dict of the default MLP, or weights for --model")
    start.add_argument("--resume", nargs="?", const="latest", metavar="RUN_ID",
                       help="continue an interrupted run (default: the newest unfinished run of --experiment) "
                            "from its last checkpoint, in the same MLflow run, with its logged configuration")

    track = parser.add_argument_group("tracking and output")
    track.add_argument("--tracking-uri", help="MLflow tracking URI (default {DFLT})")
    track.add_argument("--experiment", help="MLflow experiment name (default {DFLT})")
    track.add_argument("--run-name", help="MLflow run name")
    track.add_argument("--checkpoint-dir", help="checkpoint folder (default: checkpoints/RUN_ID beside a local SQLite store)")
    track.add_argument("--summary-json", help="write run id, resolved config, data summary and final metrics here")
    track.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    track.add_argument("--limit-train-batches", type=float, help="Lightning limit_train_batches (for quick runs)")
    track.add_argument("--limit-val-batches", type=float, help="Lightning limit_val_batches (for quick runs)")
    track.add_argument("--fast-dev-run", action="store_true", help="one batch of each loop, for smoke tests")
    track.add_argument("--eval-every", type=int, help="every N epochs, evaluate counterfactuals on the validation "
                                                     "split and log val/ip, val/ip_star, val/cost, ... (default {DFLT}: off)")
    for action in parser._actions:
        if action.help and "{DFLT}" in action.help:
            action.help = action.help.replace("{DFLT}", str(DEFAULTS[action.dest]).replace("%", "%%"))
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse arguments, train, and print where to find the run."""
    args = vars(build_parser().parse_args(argv))
    for key in ("limit_train_batches", "limit_val_batches"):
        if key in args and float(args[key]).is_integer() and (args[key] >= 1 or args[key] == 0):
            args[key] = int(args[key])
    try:
        summary = train(args)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    print(announce(summary))
    return summary


if __name__ == "__main__":
    main()
