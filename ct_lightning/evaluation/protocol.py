"""The paper's test-time evaluation protocol (SPEC §3; paper Sec. 4, App. B.5, Note 2).

Counterfactuals are generated *faithfully* for the trained model with ECCo, for factuals
drawn from a held-out split (the test split by default) and random targets (any class but
the model's current prediction). Every run draws its own factuals and targets from its own
seed; every energy penalty ``λ_egy`` of the grid is searched for the same factuals of a run.
All runs of one ``λ_egy`` are searched at once with the batched
:func:`ct_lightning.generators.search.search_counterfactuals`.

The metrics are the rows of :data:`ct_lightning.metrics.names.METRICS` that have a ``scope``, each
computed with its functional form. Per counterfactual: validity (predicted class == target, column
``valid``), and for valid ones IP (Eq. 5, mean distance to the reference samples of the target class)
and cost (ℓ1 distance to the factual). Per ``(run, λ_egy)`` group of valid counterfactuals: IP* (Eq. 6,
unbiased MMD², Gaussian kernel, length-scale 0.5). Per model: test accuracy and robust accuracy under
FGSM (ε = 0.03); besides them a robust-accuracy curve over ε ∈ [0, 0.1].

The result keeps per-sample arrays so that :mod:`ct_lightning.evaluation.compare` can bootstrap them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from ct_lightning.constraints import FeatureTypes
from ct_lightning.training.eval_mode import eval_mode
from ct_lightning.generators import (FitContext, generate_counterfactuals, generator_class, make_generator,
                                     prepare_standalone)
from ct_lightning.generators.search import search_counterfactuals
from ct_lightning.metrics.functional import robust_accuracy, validity
from ct_lightning.metrics.names import METRICS, MetricName, evaluation_metrics
from ct_lightning.training.pool import random_targets

LAMBDA_ENERGIES = (0.1, 0.5, 1.0, 5.0, 10.0)
ROBUST_EPSILONS = tuple(round(0.01 * i, 2) for i in range(11))
FACTUAL_SAMPLING = ("uniform", "balanced")
# The arguments each metric scope offers to a functional (a table row's ``inputs`` names them). Per counterfactual
# and per group they hold only the valid counterfactuals (of the group); ``logits`` are the model's at the
# counterfactuals, or at ``x`` per model; ``generator`` is a CPU generator seeded per run.
SCOPE_INPUTS = {
    "counterfactual": ("counterfactuals", "factuals", "targets", "logits", "reference_x", "reference_y", "model"),
    "group": ("counterfactuals", "factuals", "targets", "logits", "reference_x", "reference_y", "model", "generator"),
    "model": ("model", "x", "y", "logits", "domain"),
}

# Two readings of the protocol (docs/results.md, "Settling the protocol", has the file references).
# "reference": what the authors' code ran to produce Table 1 (CounterfactualTraining.jl satml runs):
#   Descent() with its default η = 0.1 (the configured 0.25 is never read), λ_cst = 0, IP as mean ℓ1
#   distance, IP* with length-scale 5 on ≤ 100 samples per side, 100 runs, factuals balanced over the
#   model's predicted classes and drawn per model, τ = 0.5 for the cost comparison.
# "paper": the values the paper's text states (Note 2, App. A.1): η = 0.25, λ_cst = 0.001, ℓ2 distance,
#   length-scale 0.5, 5 runs × 100 individuals, uniform factuals, τ = 0.95 throughout.
PROTOCOLS = {
    "reference": {"lr": 0.1, "lambda_cost": 0.0, "ip_p": 1.0, "length_scale": 5.0, "mmd_max_samples": 100,
                  "mmd_max_counterfactuals": 100, "n_runs": 100, "factuals": "balanced", "tau": 0.95,
                  "cost_tau": 0.5},
    "paper": {"lr": 0.25, "lambda_cost": 0.001, "ip_p": 2.0, "length_scale": 0.5, "mmd_max_samples": 1000,
              "mmd_max_counterfactuals": None, "n_runs": 5, "factuals": "uniform", "tau": 0.95, "cost_tau": 0.95},
}


def protocol_settings(name: str, cost_pair: bool = False) -> dict:
    """The :class:`EvaluationConfig` fields of protocol ``name`` (``cost_pair``: the protected comparison)."""
    if name not in PROTOCOLS:
        raise ValueError(f"protocol: unknown {name!r}; allowed: {', '.join(PROTOCOLS)}")
    settings = dict(PROTOCOLS[name])
    cost_tau = settings.pop("cost_tau")
    if cost_pair:
        settings["tau"] = cost_tau
    return settings


@dataclass
class EvaluationConfig:
    """Settings of the evaluation protocol; the defaults are the paper's (Note 2, App. B.5)."""

    n_individuals: int = 100
    n_runs: int = 5
    lambda_energies: tuple[float, ...] = LAMBDA_ENERGIES
    lambda_cost: float = 0.001
    generator: str = "ecco"
    lr: float = 0.25
    tau: float = 0.95
    max_steps: int = 50
    seed: int = 0
    ip_p: float = 2.0
    length_scale: float = 0.5
    mmd_max_samples: int | None = 1000
    mmd_max_counterfactuals: int | None = None
    factuals: str = "uniform"
    robust_epsilon: float = 0.03
    robust_epsilons: tuple[float, ...] = ROBUST_EPSILONS
    attack: str = "fgsm"

    def __post_init__(self):
        self.lambda_energies = tuple(float(v) for v in self.lambda_energies)
        self.robust_epsilons = tuple(float(v) for v in self.robust_epsilons)
        if self.n_individuals < 1 or self.n_runs < 1:
            raise ValueError("n_individuals and n_runs: must be at least 1")
        if not self.lambda_energies:
            raise ValueError("lambda_energies: give at least one value")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau: must lie in (0, 1], got {self.tau}")
        if self.factuals not in FACTUAL_SAMPLING:
            raise ValueError(f"factuals: unknown {self.factuals!r}; allowed: {', '.join(FACTUAL_SAMPLING)}")

    def energy_grid(self) -> tuple[float, ...]:
        """The ``λ_egy`` values searched; a generator without an energy term is searched once (λ = 0)."""
        return self.lambda_energies if getattr(generator_class(self.generator), "energy_weighted", False) else (0.0,)


@dataclass
class EvaluationResult:
    """Outcome of :func:`evaluate_model`.

    ``samples``: one entry per counterfactual (``run``, ``lambda_energy``, ``factual_index``,
    ``label``, ``prediction``, ``target``, ``valid``, ``converged``, ``steps``, and one column per
    per-counterfactual metric: ``ip``, ``cost``, NaN for invalid counterfactuals). ``groups``: one entry
    per ``(run, λ_egy)`` (``run``, ``lambda_energy``, ``n``, ``n_valid``, ``validity``, and one column per
    per-group metric: ``ip_star``). ``per_model``: the per-model metrics (``accuracy``, ``robust_accuracy``).
    ``factuals``/``counterfactuals`` hold the inputs in the same order as ``samples``.
    """

    samples: dict[str, np.ndarray]
    groups: dict[str, np.ndarray]
    per_model: dict[str, float]
    robust_curve: dict[str, list[float]]
    config: EvaluationConfig
    factuals: torch.Tensor = field(repr=False)
    counterfactuals: torch.Tensor = field(repr=False)

    @property
    def accuracy(self) -> float:
        """Clean accuracy of the model on the evaluated split."""
        return self.per_model.get("accuracy", math.nan)

    @property
    def robust_accuracy(self) -> float:
        """Accuracy under the attack at ``config.robust_epsilon`` (NaN when skipped)."""
        return self.per_model.get("robust_accuracy", math.nan)

    def metric_values(self, name: str) -> np.ndarray | None:
        """All values of metric ``name`` as evaluated: one per counterfactual (NaN where not valid), per group or
        per model (one value); ``None`` when this result does not hold it (e.g. stored before the metric existed)."""
        row = METRICS[name]
        if row.scope == "model":
            return np.asarray([self.per_model[row.source()]], dtype=float) if row.source() in self.per_model else None
        table = self.groups if row.scope == "group" else self.samples
        return np.asarray(table[row.source()], dtype=float) if row.source() in table else None

    def metric_samples(self, name: str) -> np.ndarray:
        """Finite values of metric ``name``: per valid counterfactual (``ip``, ``cost``) or per group (``ip_star``)."""
        values = self.metric_values(name)
        if values is None:
            return np.asarray([], dtype=float)
        return values[np.isfinite(values)]

    @property
    def valid(self) -> np.ndarray:
        """Boolean validity per counterfactual."""
        return self.samples["valid"]

    def summary(self) -> dict:
        """Every evaluated metric of the table (per counterfactual: pooled over valid counterfactuals; per group:
        mean over groups; per model: its value), plus counts and a per-λ breakdown of the first two kinds."""
        def mean(values) -> float | None:
            if values is None:
                return None
            values = np.asarray(values, dtype=float)
            values = values[np.isfinite(values)]
            return float(values.mean()) if values.size else None

        def model_value(key: str):
            value = self.per_model.get(METRICS[key].source())
            return None if value is None else float(value)

        spread = [key for key in evaluation_metrics() if METRICS[key].scope != "model"]
        per_lambda = {}
        for lam in np.unique(self.samples["lambda_energy"]):
            where = {"counterfactual": self.samples["lambda_energy"] == lam, "group": self.groups["lambda_energy"] == lam}
            per_lambda[f"{lam:g}"] = {}
            for key in spread:
                values = self.metric_values(key)
                per_lambda[f"{lam:g}"][key] = None if values is None else mean(values[where[METRICS[key].scope]])
        out = {key: model_value(key) if METRICS[key].scope == "model" else mean(self.metric_values(key))
               for key in evaluation_metrics()}
        out.update({
            "converged": float(self.samples["converged"].mean()),
            "n_counterfactuals": int(self.samples["valid"].size), "n_valid": int(self.samples["valid"].sum()),
            "per_lambda": per_lambda,
        })
        return out

    def to_dict(self, include_samples: bool = True) -> dict:
        """JSON-ready dictionary: config, summary, robust curve and (optionally) the per-sample arrays."""
        def plain(array: np.ndarray) -> list:
            return [None if isinstance(v, float) and not math.isfinite(v) else v for v in array.tolist()]

        out = {"config": asdict(self.config), "summary": self.summary(), "robust_curve": self.robust_curve}
        if include_samples:
            out["samples"] = {k: plain(v) for k, v in self.samples.items()}
            out["groups"] = {k: plain(v) for k, v in self.groups.items()}
        return out


def draw_factuals(n_available: int, n_individuals: int, n_runs: int, seed: int) -> torch.Tensor:
    """Indices of the factuals, shape ``(n_runs, n_individuals)``; run ``r`` uses seed ``seed + r``.

    Without replacement within a run when the split is large enough, else with replacement.
    """
    rows = []
    for run in range(n_runs):
        rng = torch.Generator().manual_seed(seed + run)
        rows.append(torch.randperm(n_available, generator=rng)[:n_individuals] if n_individuals <= n_available
                    else torch.randint(n_available, (n_individuals,), generator=rng))
    return torch.stack(rows)


def draw_balanced(predicted: torch.Tensor, n_classes: int, n_individuals: int, n_runs: int,
                  seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Factual indices and targets, shape ``(n_runs, n_individuals)``, balanced over predicted classes.

    As in the authors' benchmark: individual ``i`` gets a class ``c_i`` (uniform) and a target
    (uniform among the other classes) once, for all runs; each run then picks, for each ``i``, a
    random row whose *predicted* class is ``c_i``. A class the model never predicts is replaced by
    one it does.
    """
    rng = torch.Generator().manual_seed(seed)
    present = torch.unique(predicted)
    classes = present[torch.randint(len(present), (n_individuals,), generator=rng)]
    targets = random_targets(classes, n_classes, rng)
    rows_by_class = {int(c): torch.nonzero(predicted == c).flatten() for c in present.tolist()}
    index = torch.empty(n_runs, n_individuals, dtype=torch.long)
    for run in range(n_runs):
        run_rng = torch.Generator().manual_seed(seed + 1 + run)
        for c, rows in rows_by_class.items():
            chosen = torch.nonzero(classes == c).flatten()
            index[run, chosen] = rows[torch.randint(len(rows), (len(chosen),), generator=run_rng)]
    return index, targets.expand(n_runs, n_individuals).clone()


def draw_targets(predicted: torch.Tensor, n_classes: int, seed: int) -> torch.Tensor:
    """Random targets for ``predicted`` of shape ``(n_runs, n)``: run ``r`` draws with seed ``seed + r``."""
    return torch.stack([random_targets(row, n_classes, torch.Generator().manual_seed(10_007 + seed + run))
                        for run, row in enumerate(predicted)])


@torch.no_grad()
def _logits(model: nn.Module, x: torch.Tensor, batch_size: int = 8192) -> torch.Tensor:
    with eval_mode(model):
        return torch.cat([model(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])


def _model_device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def metric_value(row: MetricName, inputs: dict, config: EvaluationConfig):
    """Call the functional of table row ``row`` with the ``inputs`` its scope offers and its options from ``config``."""
    kwargs = {}
    for entry in row.inputs:
        parameter, _, name = entry.partition("=")
        name = name or parameter
        if name not in inputs:
            raise ValueError(f"metric {row.key!r}: input {name!r} is not offered per {row.scope}; "
                             f"allowed: {', '.join(SCOPE_INPUTS[row.scope])}")
        kwargs[parameter] = inputs[name]
    return row.functional(**kwargs, **(row.options(config) if row.options else {}))


def model_metrics(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: EvaluationConfig,
                  domain: tuple[torch.Tensor, torch.Tensor] | None = None, robust: bool = True) -> dict[str, float]:
    """The per-model metrics of the table on ``(x, y)``; with ``robust=False`` those that attack are NaN."""
    device = _model_device(model)
    x, y = x.to(device).float(), y.to(device).long()
    inputs = {"model": model, "x": x, "y": y, "logits": _logits(model, x), "domain": domain}
    return {METRICS[key].source(): math.nan if METRICS[key].attack and not robust
            else float(metric_value(METRICS[key], inputs, config)) for key in evaluation_metrics("model")}


def robust_curve(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: EvaluationConfig,
                 domain: tuple[torch.Tensor, torch.Tensor] | None = None,
                 known: dict[float, float] | None = None) -> dict[str, list[float]]:
    """Accuracy under the attack at each ``config.robust_epsilons`` (ε = 0: clean accuracy); ``known`` values are reused."""
    device = _model_device(model)
    x, y = x.to(device).float(), y.to(device).long()
    curve = dict(known or {})
    for eps in config.robust_epsilons:
        if eps not in curve:
            curve[eps] = float(validity(_logits(model, x), y)) if eps == 0 else \
                float(robust_accuracy(model, x, y, epsilon=eps, attack=config.attack, domain=domain))
    return {"epsilon": list(config.robust_epsilons), "accuracy": [curve[e] for e in config.robust_epsilons]}


def accuracy_metrics(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: EvaluationConfig,
                     domain: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """Clean accuracy, robust accuracy at ``config.robust_epsilon`` and the curve over ``robust_epsilons``.

    ``domain`` (optional ``(lower, upper)``) clamps the perturbed inputs.
    """
    values = model_metrics(model, x, y, config, domain)
    curve = robust_curve(model, x, y, config, domain, {0.0: values["accuracy"],
                                                       config.robust_epsilon: values["robust_accuracy"]})
    return {"accuracy": values["accuracy"], "robust_accuracy": values["robust_accuracy"], "robust_curve": curve}


def evaluate_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, n_classes: int | None = None,
                   config: EvaluationConfig | None = None, mutability: torch.Tensor | None = None,
                   lower: torch.Tensor | None = None, upper: torch.Tensor | None = None,
                   reference: tuple[torch.Tensor, torch.Tensor] | None = None,
                   robust: bool = True, attack_domain: bool = False,
                   x_train: torch.Tensor | None = None, feature_names: list[str] | None = None,
                   y_train: torch.Tensor | None = None, data_name: str = "data",
                   feature_types: FeatureTypes | None = None, group_metrics: bool = True) -> EvaluationResult:
    """Run the evaluation protocol for ``model`` on the split ``(x, y)`` (the test split in the paper).

    Factuals are drawn from ``x``; IP and IP* compare valid counterfactuals with the samples of
    ``reference`` (default: ``(x, y)`` itself) of the target class. ``mutability`` holds per-feature
    codes (:func:`ct_lightning.constraints.parse_mutability`), ``lower``/``upper`` the domain.
    With ``robust=False`` the FGSM metrics are skipped (NaN); ``attack_domain`` clamps FGSM
    inputs to the domain. Works under Lightning's inference mode (validation hooks).
    Generators that learn from data (``revise``, ``amortised``) are fitted on the training split
    ``x_train`` with a :class:`~ct_lightning.generators.FitContext` that also carries ``feature_names``
    (one-hot groups), ``y_train``, ``data_name`` and the constraints. ``feature_types`` (default: one-hot
    groups from ``feature_names``) makes every counterfactual a valid point (real categories, integers), and
    validity, IP, IP* and cost are measured at that point. ``group_metrics=False`` leaves the per-group
    metrics (IP*) NaN, for callers that read only the per-counterfactual ones (a grid's evaluation).
    """
    config = config or EvaluationConfig()
    device = _model_device(model)
    x, y = x.to(device).float(), y.to(device).long()
    ref_x, ref_y = (x, y) if reference is None else (reference[0].to(device).float(), reference[1].to(device).long())
    n_classes = int(n_classes or int(torch.cat([y, ref_y]).max()) + 1)
    lower = None if lower is None else lower.to(device)
    upper = None if upper is None else upper.to(device)
    if feature_types is None:
        feature_types = FeatureTypes.from_names(feature_names, x.shape[1])

    if config.factuals == "balanced":
        index, targets = draw_balanced(_logits(model, x).argmax(1).cpu(), n_classes, config.n_individuals,
                                       config.n_runs, config.seed)
        index, targets = index.to(device), targets.reshape(-1).to(device)
        factuals = x[index.reshape(-1)]
        predicted = _logits(model, factuals).argmax(1)
    else:
        index = draw_factuals(len(x), config.n_individuals, config.n_runs, config.seed).to(device)
        factuals = x[index.reshape(-1)]
        predicted = _logits(model, factuals).argmax(1)
        targets = draw_targets(predicted.reshape(index.shape).cpu(), n_classes, config.seed).reshape(-1).to(device)
    runs = torch.arange(config.n_runs).repeat_interleave(config.n_individuals)

    blocks = []
    for lam in config.energy_grid():
        generator = make_generator(config.generator, config.lambda_cost, lam, config.lr)
        if x_train is not None:
            context = FitContext(model=model, x_train=x_train.to(device).float(),
                                 y_train=None if y_train is None else y_train.to(device).long(), n_classes=n_classes,
                                 feature_names=feature_names, mutability=mutability, lower=lower, upper=upper,
                                 name=data_name, feature_types=feature_types)
            prepare_standalone(generator, context)
        elif generator.needs_fit:
            raise ValueError(f"generator: {config.generator} learns from data; pass x_train to evaluate_model")
        result = generate_counterfactuals(generator, model, factuals, targets, config.tau, config.max_steps, 0.0,
                                          mutability, lower, upper, feature_types)
        blocks.append((lam, result))

    grid = config.energy_grid()
    n_rows = len(factuals)
    counterfactuals = torch.cat([r.counterfactual for _, r in blocks])
    all_targets = targets.repeat(len(grid))
    all_factuals = factuals.repeat(len(grid), 1)
    logits = _logits(model, counterfactuals)
    valid = logits.argmax(1) == all_targets  # the validity metric's column: every other metric sees valid ones only
    per_cf = {"counterfactuals": counterfactuals, "factuals": all_factuals, "targets": all_targets, "logits": logits,
              "reference_x": ref_x, "reference_y": ref_y, "model": model}

    def restricted(rows) -> dict:
        return {k: (v[rows] if k in ("counterfactuals", "factuals", "targets", "logits") else v)
                for k, v in per_cf.items()}

    columns = {}
    for key in evaluation_metrics("counterfactual"):
        row = METRICS[key]
        if row.source() == "valid":
            continue
        values = torch.full((len(counterfactuals),), math.nan, device=device)
        if valid.any():
            values[valid] = metric_value(row, restricted(valid), config).to(values.dtype)
        columns[row.source()] = values.cpu().double().numpy()

    group_run, group_lambda, group_n, group_valid = [], [], [], []
    group_columns = {METRICS[key].source(): [] for key in evaluation_metrics("group")}
    for g, lam in enumerate(grid):
        for run in range(config.n_runs):
            rows = torch.arange(g * n_rows + run * config.n_individuals, g * n_rows + (run + 1) * config.n_individuals,
                                device=device)
            rows = rows[valid[rows]]
            for key in evaluation_metrics("group"):
                generator = torch.Generator().manual_seed(config.seed * 7919 + run)
                value = metric_value(METRICS[key], {**restricted(rows), "generator": generator}, config) \
                    if len(rows) and group_metrics else math.nan
                group_columns[METRICS[key].source()].append(float(value))
            group_run.append(run)
            group_lambda.append(lam)
            group_n.append(config.n_individuals)
            group_valid.append(len(rows))

    samples = {
        "run": runs.repeat(len(grid)).numpy(),
        "lambda_energy": np.repeat(np.asarray(grid, dtype=float), n_rows),
        "factual_index": index.reshape(-1).repeat(len(grid)).cpu().numpy(),
        "label": y[index.reshape(-1)].repeat(len(grid)).cpu().numpy(),
        "prediction": predicted.repeat(len(grid)).cpu().numpy(),
        "target": all_targets.cpu().numpy(),
        "valid": valid.cpu().numpy(),
        "converged": torch.cat([r.converged for _, r in blocks]).cpu().numpy(),
        "steps": torch.cat([r.steps for _, r in blocks]).cpu().numpy(),
        **columns,
    }
    groups = {
        "run": np.asarray(group_run), "lambda_energy": np.asarray(group_lambda, dtype=float),
        "n": np.asarray(group_n), "n_valid": np.asarray(group_valid),
        "validity": np.asarray(group_valid, dtype=float) / np.asarray(group_n, dtype=float),
        **{name: np.asarray(values, dtype=float) for name, values in group_columns.items()},
    }
    domain = (lower, upper) if attack_domain and lower is not None else None
    per_model = model_metrics(model, x, y, config, domain, robust)
    known = {0.0: per_model.get("accuracy", math.nan), config.robust_epsilon: per_model.get("robust_accuracy")}
    curve = robust_curve(model, x, y, config, domain, {e: v for e, v in known.items() if v is not None}) if robust \
        else {"epsilon": [], "accuracy": []}
    return EvaluationResult(samples, groups, per_model, curve, config, all_factuals.detach().cpu(),
                            counterfactuals.detach().cpu())


def counterfactuals_per_class(model: nn.Module, x: torch.Tensor, n_classes: int, config: EvaluationConfig | None = None,
                              lambda_energy: float = 5.0, mutability: torch.Tensor | None = None,
                              lower: torch.Tensor | None = None, upper: torch.Tensor | None = None,
                              feature_types: FeatureTypes | None = None) -> torch.Tensor:
    """Counterfactuals of every factual in ``x`` for every class, in one batched search.

    Returns shape ``(len(x), n_classes, n_features)``; entry ``[i, k]`` is the factual itself when
    ``k`` is the model's prediction for ``x[i]`` (as on the diagonal of the paper's Figure 4).
    """
    config = config or EvaluationConfig()
    device = _model_device(model)
    x = x.to(device).float()
    n, d = x.shape
    factuals = x.repeat_interleave(n_classes, 0)
    targets = torch.arange(n_classes, device=device).repeat(n)
    generator = make_generator(config.generator, config.lambda_cost, lambda_energy, config.lr)
    result = search_counterfactuals(model, factuals, targets, generator, tau=config.tau, max_steps=config.max_steps,
                                    epsilon=0.0, mutability=mutability, lower=lower, upper=upper,
                                    feature_types=feature_types)
    out = result.counterfactual.reshape(n, n_classes, d)
    predicted = _logits(model, x).argmax(1)
    out[torch.arange(n, device=device), predicted] = x
    return out.detach().cpu()
