"""Command-line options of the evaluation protocol, shared by the evaluate and compare recipes."""

from __future__ import annotations

import argparse

from ct_lightning.evaluation.protocol import LAMBDA_ENERGIES, EvaluationConfig
from ct_lightning.generators import GENERATORS


def csv_floats(text: str) -> tuple[float, ...]:
    """``"0.1,0.5,1"`` → ``(0.1, 0.5, 1.0)``."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def add_protocol_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the evaluation protocol shared by evaluate.py and compare.py."""
    d = EvaluationConfig()
    group = parser.add_argument_group("evaluation protocol (defaults: paper, Note 2)")
    group.add_argument("--n-individuals", type=int, default=d.n_individuals, help="factuals per run (default %(default)s)")
    group.add_argument("--n-runs", type=int, default=d.n_runs, help="runs with different seeds (default %(default)s)")
    group.add_argument("--lambda-energy", type=csv_floats, default=LAMBDA_ENERGIES,
                       help="ECCo energy penalties, results averaged over them (default 0.1,0.5,1,5,10)")
    group.add_argument("--generator", default=d.generator, choices=list(GENERATORS),
                       help="test-time generator (default %(default)s; revise/amortised are fitted on the training split)")
    group.add_argument("--eval-tau", type=float, default=d.tau, help="decision threshold τ (default %(default)s)")
    group.add_argument("--eval-steps", type=int, default=d.max_steps, help="maximum search steps T (default %(default)s)")
    group.add_argument("--eval-lr", type=float, default=d.lr, help="SGD step size η of the search (default %(default)s)")
    group.add_argument("--eval-seed", type=int, default=d.seed, help="seed of the first run (default %(default)s)")


def protocol_config(args: argparse.Namespace) -> EvaluationConfig:
    """The :class:`EvaluationConfig` of parsed protocol flags."""
    return EvaluationConfig(n_individuals=args.n_individuals, n_runs=args.n_runs, lambda_energies=args.lambda_energy,
                            generator=args.generator, tau=args.eval_tau, max_steps=args.eval_steps, lr=args.eval_lr, seed=args.eval_seed)
