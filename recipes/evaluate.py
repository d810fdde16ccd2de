"""Evaluate a trained model with the paper's protocol (SPEC §3) and log the results to its MLflow run.

Counterfactuals are searched faithfully with ECCo for random factuals of the test split and random
targets (λ_cst = 0.001, λ_egy ∈ {0.1, 0.5, 1, 5, 10}, η = 0.25, τ = 0.95, T = 50, 100 individuals
× 5 runs by default). Logged to the run: eval/ip, eval/ip_star, eval/cost, eval/validity, eval/acc,
eval/robust_acc, and the plots as artifacts under plots/.

Examples:
  python recipes/evaluate.py --run-id 1a6d42...                       # default local store
  python recipes/evaluate.py --run-id 1a6d42... --protect --summary-json eval.json
  python recipes/evaluate.py --checkpoint mlruns/checkpoints/1a6d42.../last.ckpt --n-runs 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ct_lightning.evaluation import (LAMBDA_ENERGIES, PROTOCOLS, EvaluationConfig, evaluate_model,  # noqa: E402
                                     protocol_settings, reference_individuals)
from ct_lightning.generators import GENERATORS  # noqa: E402
from ct_lightning.plots import evaluation_figures, metric_history  # noqa: E402
from ct_lightning.runs import (build_data, evaluation_constraints, load_checkpoint_with_config, load_run,  # noqa: E402
                               log_evaluation)
from ct_lightning.tracking import DEFAULT_TRACKING_URI, write_json_atomic  # noqa: E402


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
    """Flags of the evaluation protocol shared by evaluate.py and compare.py (unset: from --protocol)."""
    group = parser.add_argument_group("evaluation protocol (unset flags take the --protocol preset)")
    group.add_argument("--protocol", default="reference", choices=list(PROTOCOLS),
                       help="reference: what the authors' code ran for Table 1 (η 0.1, λ_cst 0, ℓ1 IP, IP* "
                            "length-scale 5, 100 runs, factuals balanced over predicted classes, τ 0.5 for "
                            "the cost pair); paper: the values stated in the paper's text (η 0.25, λ_cst 0.001, "
                            "ℓ2 IP, length-scale 0.5, 5 runs × 100) (default %(default)s)")
    group.add_argument("--n-individuals", type=int,
                       help="factuals per run (reference: 250 synthetic, 100 tabular, 25 MNIST; paper: 100)")
    group.add_argument("--n-runs", type=int, help="runs with different seeds (reference 100, paper 5)")
    group.add_argument("--lambda-energy", type=csv_floats, default=LAMBDA_ENERGIES,
                       help="ECCo energy penalties, results averaged over them (default 0.1,0.5,1,5,10)")
    group.add_argument("--generator", default="ecco", choices=list(GENERATORS),
                       help="test-time generator (default %(default)s; revise/amortised are fitted on the training split)")
    group.add_argument("--eval-tau", type=float, help="decision threshold τ (default 0.95; reference cost pair 0.5)")
    group.add_argument("--eval-steps", type=int, default=50, help="maximum search steps T (default %(default)s)")
    group.add_argument("--eval-lr", type=float, help="SGD step size η of the search (reference 0.1, paper 0.25)")
    group.add_argument("--eval-lambda-cost", type=float, help="ℓ1 penalty λ_cst of the search (reference 0, paper 0.001)")
    group.add_argument("--ip-norm", type=float, help="p of the ℓp distance in IP (reference 1, paper 2)")
    group.add_argument("--length-scale", type=float, help="Gaussian kernel length-scale of IP* (reference 5, paper 0.5)")
    group.add_argument("--eval-seed", type=int, default=0, help="seed of the first run (default %(default)s)")


def protocol_config(args: argparse.Namespace, data: str | None = None, cost_pair: bool = False) -> EvaluationConfig:
    """The :class:`EvaluationConfig` of parsed protocol flags for data set ``data`` (explicit flags win)."""
    settings = protocol_settings(args.protocol, cost_pair)
    if args.protocol == "reference":
        settings["n_individuals"] = reference_individuals(data or "")
    explicit = {"n_individuals": args.n_individuals, "n_runs": args.n_runs, "tau": args.eval_tau,
                "lr": args.eval_lr, "lambda_cost": args.eval_lambda_cost, "ip_p": args.ip_norm,
                "length_scale": args.length_scale}
    settings.update({k: v for k, v in explicit.items() if v is not None})
    return EvaluationConfig(**settings, lambda_energies=args.lambda_energy, generator=args.generator,
                            max_steps=args.eval_steps, seed=args.eval_seed)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``recipes/evaluate.py``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-id", help="MLflow run of recipes/train.py (its checkpoints/ and config.json artifacts)")
    source.add_argument("--checkpoint", help="a checkpoint file (its config.json beside it, else pass --data)")
    parser.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI, help="MLflow tracking URI (default %(default)s)")
    parser.add_argument("--which", choices=("last", "best"), default="last",
                        help="checkpoint of the run: last (end of training) or best val/acc (default %(default)s)")
    parser.add_argument("--data", help="data set, when it cannot be inferred from the run or checkpoint")
    parser.add_argument("--protect", action="store_true", help="make the data set's protected features immutable")
    parser.add_argument("--all-mutable", action="store_true", help="ignore the mutability constraints the model was trained with")
    parser.add_argument("--split", choices=("test", "val"), default="test", help="split of the factuals (default %(default)s)")
    parser.add_argument("--seed", type=int, help="alias of --eval-seed")
    parser.add_argument("--summary-json", help="write the summary, robust curve and per-sample results here")
    parser.add_argument("--out-dir", help="folder for the plots (default: a temporary folder)")
    parser.add_argument("--no-log", dest="log", action="store_false", help="do not log to the MLflow run")
    parser.add_argument("--unsafe-load", action="store_true",
                        help="load checkpoints with weights_only=False (only for checkpoints you trust)")
    add_protocol_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Load, evaluate, log to the run, plot, and write the JSON summary."""
    args = build_parser().parse_args(argv)
    if args.seed is not None:
        args.eval_seed = args.seed
    try:
        if args.run_id:
            loaded = load_run(args.run_id, args.tracking_uri, args.which, weights_only=not args.unsafe_load)
            if args.data:
                loaded.config["data"] = args.data
        else:
            loaded = load_checkpoint_with_config(args.checkpoint, args.data, weights_only=not args.unsafe_load)
        datamodule = build_data(loaded.config)
        config = protocol_config(args, datamodule.name, cost_pair=args.protect)
        constraints = evaluation_constraints(loaded.module, datamodule, args.protect, args.all_mutable)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    x, y = (datamodule.x_test, datamodule.y_test) if args.split == "test" else (datamodule.x_val, datamodule.y_val)
    result = evaluate_model(loaded.module, x, y, datamodule.n_classes, config, constraints.mutability,
                            constraints.lower, constraints.upper, x_train=datamodule.x_train)
    summary = result.summary()

    client = None
    convergence = None
    if loaded.run_id:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=args.tracking_uri)
        history = metric_history(client, loaded.run_id)
        convergence = {"CT" if loaded.config.get("objective") != "vanilla" else "BL": history} if history else None
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="ct-eval-plots-"))
    label = "BL" if loaded.config.get("objective") == "vanilla" else f"CT ({loaded.config.get('objective', 'full')})"
    plots = evaluation_figures({label: {"module": loaded.module, "result": result, "constraints": constraints}},
                               datamodule, out_dir, convergence)
    logged = {}
    if client is not None and args.log:
        logged = log_evaluation(client, loaded.run_id, summary)
        for path in plots:
            client.log_artifact(loaded.run_id, str(path), artifact_path="plots")

    payload = {"run_id": loaded.run_id, "checkpoint": loaded.checkpoint, "data": datamodule.name,
               "split": args.split, "immutable": constraints.immutable, "logged": logged,
               "plots": [str(p) for p in plots], **result.to_dict(include_samples=True)}
    if args.summary_json:
        write_json_atomic(args.summary_json, payload)
    shown = {k: v for k, v in summary.items() if k != "per_lambda"}
    print(f"data {datamodule.name} ({args.split} split), immutable: {constraints.immutable or 'none'}")
    for key, value in shown.items():
        print(f"  {key:>18}: {value:.4f}" if isinstance(value, float) else f"  {key:>18}: {value}")
    if logged:
        print(f"logged {', '.join(logged)} to run {loaded.run_id}")
    print(f"plots: {out_dir}")
    return payload


if __name__ == "__main__":
    main()
