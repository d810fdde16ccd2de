"""The evaluation protocol of the evaluate and compare recipes: its options (rows of ``experiment.options``) and
the :class:`EvaluationConfig` they make."""

from __future__ import annotations

import argparse

from ct_lightning.experiment.configuration.options import EVAL, add_arguments

PROTOCOL_OPTIONS = ("protocol", "n_individuals", "n_runs", "lambda_energies", "generator", "eval_tau", "eval_steps",
                    "eval_lr", "eval_lambda_cost", "ip_norm", "length_scale", "eval_seed")


def add_protocol_arguments(parser: argparse.ArgumentParser) -> None:
    """The protocol's options in their own ``--help`` section (unset: from the ``--protocol`` preset)."""
    group = parser.add_argument_group(f"{EVAL} (unset flags take the --protocol preset)")
    add_arguments(group, PROTOCOL_OPTIONS, generator="ecco")


def reference_individuals(data: str | None) -> int:
    """Individuals per run in the authors' Table 1 runs: the data module's ``eval_individuals``
    (250 synthetic, 25 MNIST, 100 tabular and by default)."""
    from datamodules import TensorDataModule  # noqa: PLC0415 - imports torch

    from ct_lightning.experiment.configuration.settings import data_class  # noqa: PLC0415 - a name, a table file or a factory

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
    return EvaluationConfig(**settings, lambda_energies=tuple(args.lambda_energies), generator=args.generator,
                            max_steps=args.eval_steps, seed=args.eval_seed)
