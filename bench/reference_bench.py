"""Section ``reference``: our vanilla and CT epochs against a plain-PyTorch loop (issue 13).

The plain loop is what a user would write by hand: the same model (built by
``ct_lightning.models.build_model`` from the same seed), the same batch size, Adam with the
same learning rate, the same data order (``torch.randperm`` from a generator seeded like the
data module's, which is what ``DataLoader(shuffle=True, generator=...)`` draws), and a forward
pass over the validation split each epoch. Our epochs are measured as users run them: a
``train()`` run of ``ct_lightning.experiment.runs.train`` with validation, both checkpoint callbacks
and MLflow logging into a temporary SQLite store. The comparison is paired (:class:`PairedEpochs`):
before each of our epochs one epoch of the plain loop (and of :class:`PlainCTLoop`) runs in the same
process, so that a change in the machine's load hits both sides of each ratio alike; an epoch of ours
is timed from one ``on_train_epoch_start`` to the next (the last one to ``on_train_end``), and the
first epoch of every run is a warm-up that is left out.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from bench.common import Clock, median, sync
from datamodules.base import EVAL_BATCH_SIZE

# CT epoch ≤ TARGET × plain epoch (issue 13); vanilla ≤ 1.2× everywhere.
CT_TARGETS = {"circles": 1.5, "adult": 2.0, "mnist": 4.0, "mnist-cnn": 3.0}
VANILLA_TARGET = 1.2


def _settings(datamodule, overrides: dict) -> dict:
    from ct_lightning.experiment.configuration.settings import DATA_DEFAULT_KEYS, DEFAULTS

    return {**DEFAULTS, **{k: v for k, v in datamodule.ct_defaults.items() if k in DATA_DEFAULT_KEYS}, **overrides}


def _hand_written_setup(datamodule, architecture: str, device: torch.device, seed: int):
    """What both hand-written loops start from: the settings, the seeded model, Adam, and the data on ``device``."""
    from ct_lightning.models import build_model

    config = _settings(datamodule, {})
    torch.manual_seed(seed)
    model = build_model(architecture, datamodule.n_features, datamodule.n_classes,
                        list(config.get("hidden_sizes") or [32]), config.get("activation") or "relu").to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=config["lr"])
    x, y = datamodule.x_train.to(device), datamodule.y_train.to(device)
    return config, model, optimiser, x, y, datamodule.x_val.to(device)


def _validation_forward(model, x_val: torch.Tensor, batch: int) -> None:
    """The forward pass over the validation split, in the validation loader's batches."""
    model.eval()
    eval_batch = max(batch, EVAL_BATCH_SIZE)
    with torch.no_grad():
        for start in range(0, len(x_val), eval_batch):
            model(x_val[start:start + eval_batch])


class PlainLoop:
    """The hand-written loop, one epoch per call of :meth:`epoch` (train + validation forward); ``step``, if set, is
    called as ``step(x, y)`` instead of each optimisation step (``bench/hand_step.py``)."""

    step = None

    def __init__(self, datamodule, architecture: str, device: torch.device, seed: int = 0):
        _, self.model, self.optimiser, self.x, self.y, self.x_val = _hand_written_setup(datamodule, architecture,
                                                                                          device, seed)
        self.batch, self.device = datamodule.batch_size, device
        self.generator = torch.Generator().manual_seed(datamodule.seed)

    def epoch(self) -> tuple[float, float]:
        """Wall and CPU seconds of one epoch."""
        model, optimiser, x, y, batch = self.model, self.optimiser, self.x, self.y, self.batch
        sync(self.device)
        clock = Clock()
        model.train()
        order = torch.randperm(len(y), generator=self.generator).to(self.device)
        for start in range(0, len(y), batch):
            index = order[start:start + batch]
            if self.step is not None:
                self.step(x[index], y[index])
                continue
            optimiser.zero_grad()
            F.cross_entropy(model(x[index]), y[index]).backward()
            optimiser.step()
        _validation_forward(model, self.x_val, batch)
        sync(self.device)
        return clock.read()


class PlainCTLoop:
    """A hand-written loop doing a ``train()`` CT epoch's work without Lightning, one epoch per :meth:`epoch`: the
    paper-default pool (nce factuals, random targets, x⁺, the library's batched search under the same constraints
    as ``train()``'s: the data's feature types, so one-hot groups and integers snap as they do there, and the default
    mutability), then per batch one forward over [x, x⁺, x', x'_tε] of the batch's share of the pool, Eq. 2's loss,
    backward and Adam; then the validation forward. The limit of our CT epoch on this machine (issue 13's rule: the
    limit for an epoch is a plain loop doing the same work). ``step``, if set, is called as ``step(x, y, pool)`` (the
    step's ``CounterfactualPool`` chunk) instead of each optimisation step (``bench/hand_step.py``)."""

    step = None

    def __init__(self, datamodule, architecture: str, device: torch.device, seed: int = 0):
        from ct_lightning.constraints import parse_mutability, resolve_domain, resolve_feature_types
        from ct_lightning.generators import make_generator
        from ct_lightning.training.pool import ClassSampler

        self.config, self.model, self.optimiser, self.x, self.y, self.x_val = _hand_written_setup(
            datamodule, architecture, device, seed)
        config = self.config
        lower, upper = resolve_domain("infer", datamodule.x_train, config["domain_std"], datamodule)
        self.lower, self.upper = lower.to(device), upper.to(device)
        names = getattr(datamodule, "feature_names", None) or None
        n_features = datamodule.x_train.shape[1]
        self.mutability = parse_mutability(config.get("mutability", ""), n_features, names).to(device)
        self.feature_types = resolve_feature_types(datamodule, names, n_features)
        self.search = make_generator(config["generator"], config["lambda_cost"], config["lambda_energy"],
                                     config["search_lr"])
        self.sampler = ClassSampler(datamodule.y_train, datamodule.n_classes)
        self.batch, self.n_classes, self.device = datamodule.batch_size, datamodule.n_classes, device
        self.generator = torch.Generator().manual_seed(datamodule.seed)
        self.rng = torch.Generator().manual_seed(seed)

    def epoch(self) -> tuple[float, float]:
        """Wall and CPU seconds of one epoch."""
        from ct_lightning.generators.search import search_counterfactuals
        from ct_lightning.losses import adversarial_loss, contrast_pairs, energy_terms
        from ct_lightning.training.pool import CounterfactualPool, chunk_bounds, random_targets

        config, model, optimiser, x, y, device = self.config, self.model, self.optimiser, self.x, self.y, self.device
        batch, rng = self.batch, self.rng
        n_batches = -(-len(y) // batch)
        sync(device)
        clock = Clock()
        index = torch.randperm(len(y), generator=rng)[:config["nce"]].to(device)
        factuals, labels = x[index], y[index]
        model.eval()
        with torch.no_grad():
            target = random_targets(model(factuals).argmax(1), self.n_classes, rng)
        x_pos = x[self.sampler.sample(target, rng).to(device)]
        result = search_counterfactuals(model, factuals, target, self.search, config["tau"], config["max_steps"],
                                        config["epsilon"], self.mutability, self.lower, self.upper,
                                        feature_types=self.feature_types)
        x_pos, x_neg = contrast_pairs(x_pos, result.counterfactual, result.converged, self.mutability)
        bounds = chunk_bounds(len(index), n_batches)
        model.train()
        order = torch.randperm(len(y), generator=self.generator).to(device)
        for step, start in enumerate(range(0, len(y), batch)):
            rows = order[start:start + batch]
            part = slice(bounds[step], bounds[step + 1])
            m = bounds[step + 1] - bounds[step]
            if self.step is not None:
                self.step(x[rows], y[rows], CounterfactualPool(x_pos[part], x_neg[part], result.nascent[part],
                                                               labels[part], target[part]))
                continue
            logits = model(torch.cat([x[rows], x_pos[part], x_neg[part], result.nascent[part]]))
            logits, logits_pos, logits_neg, logits_adv = logits.split([len(rows), m, m, m])
            div, ridge = energy_terms(logits_pos, logits_neg, target[part])
            loss = (config["lambda_clf"] * F.cross_entropy(logits, y[rows]) + config["lambda_div"] * div
                    + config["lambda_reg"] * ridge + config["lambda_adv"] * adversarial_loss(logits_adv, labels[part]))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        _validation_forward(model, self.x_val, batch)
        sync(device)
        return clock.read()


class PairedEpochs(L.Callback):
    """Times every epoch of the ``train()`` run it is attached to and, just before each one, runs one epoch of each
    hand-written loop in ``loops``: each of our epochs has its plain epochs measured next to it in time, so that
    a change in the shared machine's speed (we saw the plain epoch go from 0.04 to 0.11 s between runs minutes
    apart) hits both sides of each ratio alike. An epoch of ours runs from one ``on_train_epoch_start`` (after the
    plain epochs) to the next (before them), the last one to ``on_train_end``."""

    def __init__(self, loops: dict, device: torch.device):
        self.loops, self.device = loops, device
        self.ours: list[tuple[float, float]] = []
        self.plain: dict[str, list[tuple[float, float]]] = {name: [] for name in loops}
        self._clock = None

    def _close(self) -> None:
        if self._clock is not None:
            sync(self.device)
            self.ours.append(self._clock.read())
            self._clock = None

    def on_train_epoch_start(self, trainer, pl_module):
        self._close()
        for name, loop in self.loops.items():
            self.plain[name].append(loop.epoch())
        sync(self.device)
        self._clock = Clock()

    def on_train_end(self, trainer, pl_module):
        self._close()


def our_epochs(data: str, objective: str, architecture: str, epochs: int, accelerator: str, store: Path,
               paired: PairedEpochs, seed: int = 0, epoch_loop: str = "auto", search_compile: str = "auto") -> list:
    """Wall/CPU seconds of each epoch of a ``train()`` run (validation, checkpoints, MLflow included), timed by
    ``paired`` with its plain epochs beside them."""
    from ct_lightning.experiment.runs.train import train

    train({"data": data, "objective": objective, "model": architecture, "max_epochs": epochs, "seed": seed,
           "accelerator": accelerator, "progress": False, "epoch_loop": epoch_loop, "search_compile": search_compile,
           "tracking_uri": f"sqlite:///{store / 'mlflow.db'}",
           "experiment": "bench-reference"}, callbacks=[paired])
    return paired.ours


def _paired_ratio(ours: list, plain: list, column: int) -> float:
    """The median over paired epochs of ours / plain (column 0: wall, 1: CPU seconds)."""
    return median(a[column] / b[column] for a, b in zip(ours, plain))


def run_reference_section(name: str, datamodule, epochs: int, repeats: int, accelerator: str,
                          architecture: str = "mlp", log=print) -> dict:
    """Our vanilla and full ``train()`` runs, ``repeats`` each, every epoch paired with a plain (and, for the MLP, a
    plain CT) epoch run just before it (:class:`PairedEpochs`); ratios are medians over the pairs after each run's
    warm-up epoch."""
    from bench.common import pick_device
    from ct_lightning.generators.compiled_step import AUTO_MIN_VALUES

    device = pick_device("cuda" if accelerator in ("gpu", "cuda") else
                         "cpu" if accelerator == "cpu" else "auto")
    for logger_name in ("mlflow", "alembic"):
        logging.getLogger(logger_name).setLevel(logging.ERROR)
    # vanilla/full: as users run them (the default epoch loop, fused on one process); vanilla_lightning: the
    # same run with Lightning's per-batch loop (epoch_loop="lightning"), for what fusing the epoch saves;
    # full_eager: the CT run with search_compile off, where auto compiles the search step (large pools).
    variants = {"vanilla": {"objective": "vanilla"}, "full": {"objective": "full"},
                "vanilla_lightning": {"objective": "vanilla", "epoch_loop": "lightning"}}
    if architecture == "mlp" and _settings(datamodule, {})["nce"] * datamodule.n_features >= AUTO_MIN_VALUES:
        variants["full_eager"] = {"objective": "full", "search_compile": "off"}
    # The CNN's CT epoch takes ~50 s here; a plain CT loop beside every epoch would double the section.
    with_plain_ct = architecture == "mlp"
    pairs = {key: [] for key in variants}  # key -> [(ours, plain, plain_ct or None)] after each run's warm-up
    with tempfile.TemporaryDirectory(prefix="ct-bench-reference-") as folder:
        store = Path(folder)
        for _ in range(repeats):
            for key, variant in variants.items():
                loops = {"plain": PlainLoop(datamodule, architecture, device)}
                if with_plain_ct:
                    loops["plain_ct"] = PlainCTLoop(datamodule, architecture, device)
                paired = PairedEpochs(loops, device)
                our_epochs(name, variant["objective"], architecture, epochs, accelerator, store, paired,
                           epoch_loop=variant.get("epoch_loop", "auto"),
                           search_compile=variant.get("search_compile", "auto"))
                ct = paired.plain.get("plain_ct", [None] * len(paired.ours))
                pairs[key] += list(zip(paired.ours, paired.plain["plain"], ct))[1:]
    out = {"architecture": architecture, "epochs": epochs, "repeats": repeats, "batch_size": datamodule.batch_size,
           "n_train": len(datamodule.y_train), "n_val": len(datamodule.y_val), "paired": True}
    plain_all = [p for values in pairs.values() for _, p, _ in values]
    out["plain"] = {"epoch_s": median(w for w, _ in plain_all), "epoch_cpu_s": median(c for _, c in plain_all),
                    "epochs_s": [w for w, _ in plain_all]}
    if with_plain_ct:
        ct_pairs = [(c, p) for values in pairs.values() for _, p, c in values]
        out["plain_ct"] = _summary([c for c, _ in ct_pairs], [p for _, p in ct_pairs], None)
    ct_target = CT_TARGETS.get(name if architecture == "mlp" else f"{name}-{architecture}")
    for key, values in pairs.items():
        target = {"vanilla": VANILLA_TARGET, "full": ct_target}.get(key)
        out[key] = _summary([o for o, _, _ in values], [p for _, p, _ in values], target)
        if key == "full" and with_plain_ct:  # what train() adds to the CT work, each epoch against its own plain CT
            out[key]["ratio_to_plain_ct_cpu"] = _paired_ratio([o for o, _, _ in values], [c for _, _, c in values], 1)
    log(f"  plain {out['plain']['epoch_s']:.3f} s  vanilla {out['vanilla']['epoch_s']:.3f} s "
        f"(×{out['vanilla']['ratio']:.2f}, CPU ×{out['vanilla']['ratio_cpu']:.2f})  full {out['full']['epoch_s']:.3f} s "
        f"(×{out['full']['ratio']:.2f}, CPU ×{out['full']['ratio_cpu']:.2f})  vanilla with Lightning's "
        f"per-batch loop {out['vanilla_lightning']['epoch_s']:.3f} s (CPU ×{out['vanilla_lightning']['ratio_cpu']:.2f})"
        + (f"  full, eager search step {out['full_eager']['epoch_s']:.3f} s (CPU ×{out['full_eager']['ratio_cpu']:.2f})"
           if "full_eager" in out else "")
        + (f"  plain CT loop {out['plain_ct']['epoch_s']:.3f} s (CPU ×{out['plain_ct']['ratio_cpu']:.2f}); "
           f"full / plain CT loop CPU ×{out['full']['ratio_to_plain_ct_cpu']:.2f}" if "plain_ct" in out else ""))
    return out


def _summary(ours: list, plain: list, target: float | None) -> dict:
    """Medians of ``ours`` and its paired ratios to ``plain`` (wall and CPU), against ``target``."""
    ratio_cpu = _paired_ratio(ours, plain, 1)
    return {"epoch_s": median(w for w, _ in ours), "epoch_cpu_s": median(c for _, c in ours),
            "epochs_s": [w for w, _ in ours], "ratio": _paired_ratio(ours, plain, 0), "ratio_cpu": ratio_cpu,
            "target": target, "met": None if target is None else ratio_cpu <= target}


def protocol_time(name: str, datamodule, device: torch.device, log=print, n_runs: int | None = None) -> dict:
    """Wall/CPU seconds of the evaluation protocol (``--protocol reference``: 100 runs × the set's individuals ×
    5 λ_egy, T = 50) for one briefly trained MLP, robust accuracy included."""
    from bench.common import train_vanilla
    from ct_lightning.evaluation.protocol import EvaluationConfig, evaluate_model, protocol_settings
    from ct_lightning.experiment.configuration.protocol_options import reference_individuals

    model, _ = train_vanilla(datamodule, epochs=1, device=device)
    settings = {**protocol_settings("reference"), **({"n_runs": n_runs} if n_runs else {})}
    config = EvaluationConfig(**settings, n_individuals=reference_individuals(name))
    lower, upper = datamodule.domain(3.0)
    sync(device)
    clock = Clock()
    evaluate_model(model, datamodule.x_test.to(device), datamodule.y_test.to(device), datamodule.n_classes, config,
                   lower=lower.to(device), upper=upper.to(device), x_train=datamodule.x_train.to(device),
                   y_train=datamodule.y_train.to(device), data_name=name)
    sync(device)
    wall, cpu = clock.read()
    out = {"data": name, "n_runs": config.n_runs, "n_individuals": config.n_individuals,
           "lambda_energies": list(config.lambda_energies), "max_steps": config.max_steps, "wall_s": wall, "cpu_s": cpu,
           "device": str(device)}
    log(f"[protocol] {name}: {config.n_runs} runs × {config.n_individuals} individuals × "
        f"{len(config.lambda_energies)} λ, T = {config.max_steps}: {wall:.1f} s (CPU {cpu:.1f} s)")
    return out
