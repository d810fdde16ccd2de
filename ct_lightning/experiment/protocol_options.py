"""Command-line options of the evaluation protocol, shared by the evaluate and compare recipes."""

from __future__ import annotations

import argparse

from ct_lightning.experiment import catalogue
from ct_lightning.experiment.validation import Rule

PROTOCOL = "ct_lightning.evaluation.protocol"  # read without importing torch (see catalogue)


def csv_floats(text: str) -> tuple[float, ...]:
    """``"0.1,0.5,1"`` → ``(0.1, 0.5, 1.0)``: finite numbers ≥ 0."""
    return tuple(Rule("floats", low=0.0).argtype()(text))


def add_protocol_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the evaluation protocol shared by evaluate.py and compare.py (unset: from --protocol)."""
    protocols = list(catalogue.constant(PROTOCOL, "PROTOCOLS"))
    group = parser.add_argument_group("evaluation protocol (unset flags take the --protocol preset)")
    group.add_argument("--protocol", default="reference", type=Rule(choices=protocols).argtype(),
                       metavar="{" + ",".join(protocols) + "}",
                       help="reference: what the authors' code ran for Table 1 (η 0.1, λ_cst 0, ℓ1 IP, IP* "
                            "length-scale 5, 100 runs, factuals balanced over predicted classes, τ 0.5 for "
                            "the cost pair); paper: the values stated in the paper's text (η 0.25, λ_cst 0.001, "
                            "ℓ2 IP, length-scale 0.5, 5 runs × 100) (default %(default)s)")
    group.add_argument("--n-individuals", type=Rule("int", low=1).argtype(),
                       help="factuals per run (reference: 250 synthetic, 100 tabular, 25 MNIST; paper: 100)")
    group.add_argument("--n-runs", type=Rule("int", low=1).argtype(),
                       help="runs with different seeds (reference 100, paper 5)")
    group.add_argument("--lambda-energy", type=csv_floats,
                       default=tuple(catalogue.constant(PROTOCOL, "LAMBDA_ENERGIES")),
                       help="ECCo energy penalties, results averaged over them (default 0.1,0.5,1,5,10)")
    group.add_argument("--generator", default="ecco", type=Rule(choices=catalogue.generators).argtype(),
                       metavar="{" + ",".join(catalogue.generators()) + "}",
                       help="test-time generator (default %(default)s; revise/amortised are fitted on the training split)")
    group.add_argument("--eval-tau", type=Rule("float", 0.0, 1.0, low_open=True).argtype(),
                       help="decision threshold τ (default 0.95; reference cost pair 0.5)")
    group.add_argument("--eval-steps", type=Rule("int", low=1).argtype(), default=50,
                       help="maximum search steps T (default %(default)s)")
    group.add_argument("--eval-lr", type=Rule("float", low=0.0, low_open=True).argtype(),
                       help="SGD step size η of the search (reference 0.1, paper 0.25)")
    group.add_argument("--eval-lambda-cost", type=Rule("float", low=0.0).argtype(),
                       help="ℓ1 penalty λ_cst of the search (reference 0, paper 0.001)")
    group.add_argument("--ip-norm", type=Rule("float", low=1.0).argtype(),
                       help="p of the ℓp distance in IP (reference 1, paper 2)")
    group.add_argument("--length-scale", type=Rule("float", low=0.0, low_open=True).argtype(),
                       help="Gaussian kernel length-scale of IP* (reference 5, paper 0.5)")
    group.add_argument("--eval-seed", type=Rule("int", low=0).argtype(), default=0,
                       help="seed of the first run (default %(default)s)")


def reference_individuals(data: str | None) -> int:
    """Individuals per run in the authors' Table 1 runs: the data module's ``eval_individuals``
    (250 synthetic, 25 MNIST, 100 tabular and by default)."""
    from datamodules import TensorDataModule  # noqa: PLC0415 - imports torch

    from ct_lightning.experiment.settings import data_class  # noqa: PLC0415 - a name, a table file or a factory

    return (data_class(data) if data else TensorDataModule).eval_individuals


def protocol_config(args: argparse.Namespace, data: str | None = None, cost_pair: bool = False) -> EvaluationConfig:
    """The :class:`EvaluationConfig` of parsed protocol flags for data set ``data`` (explicit flags win)."""
    from ct_lightning.evaluation.protocol import EvaluationConfig, protocol_settings  # noqa: PLC0415

    settings = protocol_settings(args.protocol, cost_pair)
    if args.protocol == "reference":
        settings["n_individuals"] = reference_individuals(data)
    explicit = {"n_individuals": args.n_individuals, "n_runs": args.n_runs, "tau": args.eval_tau,
                "lr": args.eval_lr, "lambda_cost": args.eval_lambda_cost, "ip_p": args.ip_norm,
                "length_scale": args.length_scale}
    settings.update({k: v for k, v in explicit.items() if v is not None})
    return EvaluationConfig(**settings, lambda_energies=args.lambda_energy, generator=args.generator,
                            max_steps=args.eval_steps, seed=args.eval_seed)
