"""Figures of the paper's evaluation, as PNG files (matplotlib, Agg backend).

- :func:`plot_decision_boundaries`: 2-D data, BL and CT side by side (Figure 1).
- :func:`plot_counterfactual_grid` and :func:`plot_integrated_gradients`: MNIST (Figures 2, 4, 5).
- :func:`plot_robust_accuracy`: accuracy under FGSM over ε ∈ [0, 0.1] (Figure 3).
- :func:`plot_convergence`: share of mature (converged) counterfactuals per epoch during training.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.patches  # noqa: E402,F401
import matplotlib.ticker  # noqa: E402,F401
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from ct_lightning.training.eval_mode import eval_mode  # noqa: E402

CLASS_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf")


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


@torch.no_grad()
def _probability_grid(model: nn.Module, xx: np.ndarray, yy: np.ndarray, positive_class: int = 1) -> np.ndarray:
    device = next(model.parameters()).device
    points = torch.as_tensor(np.c_[xx.ravel(), yy.ravel()], dtype=torch.float32, device=device)
    with eval_mode(model):
        probability = model(points).softmax(1)[:, positive_class]
    return probability.reshape(xx.shape).cpu().numpy()


def panel_title(label: str, feature_names=None, immutable=None) -> str:
    """Panel title naming the immutable features, e.g. ``CT (x1 immutable)``."""
    immutable = list(immutable or [])
    if not immutable:
        return f"{label} (all mutable)"
    return f"{label} ({', '.join(map(str, immutable))} immutable)"


def plot_decision_boundaries(panels: list[dict], path, x_train, y_train, feature_names=("x1", "x2"),
                             max_points: int = 600, resolution: int = 200, suptitle: str | None = None) -> Path:
    """Side-by-side 2-D panels like the paper's Figure 1.

    Each panel is a dict with ``model`` (returns logits), ``title``, and optionally
    ``factuals``/``counterfactuals`` (tensors ``(n, 2)``) and ``targets``. The background is the
    predicted probability of class 1 with the 0.5 contour in green; training data are coloured by
    class (subsampled to ``max_points``); counterfactuals are stars coloured by target class,
    each linked to its factual by a thin grey line.
    """
    x_train, y_train = np.asarray(x_train, dtype=float), np.asarray(y_train)
    if x_train.shape[1] != 2:
        raise ValueError(f"plot_decision_boundaries: needs 2-D data, got {x_train.shape[1]} features")
    points = [x_train] + [np.asarray(p["counterfactuals"], dtype=float) for p in panels
                          if p.get("counterfactuals") is not None and len(p["counterfactuals"])]
    stacked = np.concatenate(points)
    lo, hi = stacked.min(0), stacked.max(0)
    pad = 0.1 * (hi - lo) + 1e-6
    xx, yy = np.meshgrid(np.linspace(lo[0] - pad[0], hi[0] + pad[0], resolution),
                         np.linspace(lo[1] - pad[1], hi[1] + pad[1], resolution))
    rng = np.random.default_rng(0)
    shown = rng.permutation(len(x_train))[:max_points]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    fig.subplots_adjust(wspace=0.3)
    contour = None
    for ax, panel in zip(axes[0], panels):
        probability = _probability_grid(panel["model"], xx, yy)
        contour = ax.contourf(xx, yy, probability, levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.35)
        ax.contour(xx, yy, probability, levels=[0.5], colors="green", linewidths=2)
        for k in np.unique(y_train):
            sel = shown[y_train[shown] == k]
            ax.scatter(x_train[sel, 0], x_train[sel, 1], s=8, alpha=0.5, color=CLASS_COLOURS[int(k) % 10],
                       label=f"class {k}")
        cf = panel.get("counterfactuals")
        if cf is not None and len(cf):
            cf = np.asarray(cf, dtype=float)
            targets = np.asarray(panel.get("targets", np.zeros(len(cf))), dtype=int)
            factuals = panel.get("factuals")
            if factuals is not None:
                factuals = np.asarray(factuals, dtype=float)
                for a, b in zip(factuals, cf):
                    ax.plot([a[0], b[0]], [a[1], b[1]], color="grey", lw=0.5, alpha=0.6)
            ax.scatter(cf[:, 0], cf[:, 1], marker="*", s=140, c=[CLASS_COLOURS[t % 10] for t in targets],
                       edgecolors="black", linewidths=0.8, label="counterfactual", zorder=3)
        ax.set_title(panel.get("title", ""))
        ax.set_xlabel(feature_names[0])
        ax.set_ylabel(feature_names[1])
        ax.set_xlim(xx.min(), xx.max())
        ax.set_ylim(yy.min(), yy.max())
    axes[0][0].legend(loc="best", fontsize=7, framealpha=0.8)
    if contour is not None:
        fig.colorbar(contour, ax=axes[0].tolist(), shrink=0.8, label="P(class 1)")
    if suptitle:
        fig.suptitle(suptitle)
    return _save(fig, path)


def plot_robust_accuracy(curves: dict[str, dict], path, title: str = "Accuracy under FGSM") -> Path:
    """Accuracy against the FGSM perturbation size; ``curves`` maps a label to ``{"epsilon", "accuracy"}``."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for label, curve in curves.items():
        ax.plot(curve["epsilon"], curve["accuracy"], marker="o", ms=3, label=label)
    ax.set_xlabel("perturbation size ε (FGSM)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    return _save(fig, path)


def plot_robust_accuracy_panels(rows: list[dict], path, roles=("bl", "ct")) -> Path | None:
    """Figure 3: one panel per data set with BL and CT accuracy under FGSM over ε (from Table 1 rows)."""
    rows = [row for row in rows if all(row.get("robust_curves", {}).get(r, {}).get("epsilon") for r in roles)]
    if not rows:
        return None
    columns = min(5, len(rows))
    n_rows = math.ceil(len(rows) / columns)
    fig, axes = plt.subplots(n_rows, columns, figsize=(3.2 * columns, 2.8 * n_rows), squeeze=False)
    for ax, row in zip(axes.flat, rows):
        for role in roles:
            curve = row["robust_curves"][role]
            ax.plot(curve["epsilon"], curve["accuracy"], marker="o", ms=3, label=role.upper())
        ax.set_title(row["data"])
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("ε (FGSM)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    axes[0][0].set_ylabel("test accuracy")
    axes[0][0].legend()
    fig.suptitle("Accuracy under FGSM, BL vs CT", y=1.04)
    return _save(fig, path)


def metric_history(client, run_id: str, key: str = "train/cf_converged") -> list[float]:
    """Values of an MLflow metric in step order (one per epoch for CT's search statistics)."""
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    # A resumed run may log an epoch twice (before the kill and again after it): keep the last value per step.
    return list({m.step: m.value for m in history}.values())


def plot_convergence(histories: dict[str, list[float]], path,
                     title: str = "Share of mature (converged) counterfactuals per epoch") -> Path:
    """Line plot of ``train/cf_converged`` per epoch for each labelled run."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, values in histories.items():
        if values:
            ax.plot(range(1, len(values) + 1), values, label=label)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("epoch (with CT active)")
    ax.set_ylabel("share converged")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if any(histories.values()):
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no counterfactual search logged", ha="center", transform=ax.transAxes)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def _image(vector, shape):
    return np.asarray(vector, dtype=float).reshape(shape)


def plot_counterfactual_grid(grids: dict[str, torch.Tensor], path, image_shape=(28, 28),
                             value_range=(-1.0, 1.0), factuals: torch.Tensor | None = None) -> Path:
    """Factuals and their counterfactuals per target class, one block of rows per model.

    ``grids`` maps a label (e.g. ``BL``/``CT``) to a tensor ``(n_factuals, n_classes, n_features)``
    from :func:`ct_lightning.evaluation.counterfactuals_per_class`; column ``k`` shows the
    counterfactual for target class ``k`` (the factual itself in its predicted class's column,
    framed in blue when ``factuals`` are given).
    """
    labels = list(grids)
    n_factuals, n_classes = next(iter(grids.values())).shape[:2]
    rows = n_factuals * len(labels)
    fig, axes = plt.subplots(rows, n_classes, figsize=(1.1 * n_classes, 1.15 * rows + 0.4), squeeze=False)
    for b, label in enumerate(labels):
        grid = grids[label]
        for i in range(n_factuals):
            for k in range(n_classes):
                ax = axes[b * n_factuals + i][k]
                ax.imshow(_image(grid[i, k], image_shape), cmap="gray", vmin=value_range[0], vmax=value_range[1])
                if factuals is not None and torch.equal(torch.as_tensor(grid[i, k]), torch.as_tensor(factuals[i])):
                    for spine in ax.spines.values():
                        spine.set_edgecolor("tab:blue")
                        spine.set_linewidth(3)
                ax.set_xticks([])
                ax.set_yticks([])
                if b == 0 and i == 0:
                    ax.set_title(f"→ {k}", fontsize=8)
            axes[b * n_factuals + i][0].set_ylabel(label if i == 0 else "", fontsize=9)
    fig.suptitle("Counterfactuals per target class (columns)", fontsize=10)
    return _save(fig, path)


def integrated_gradients_by_class(model: nn.Module, x: torch.Tensor, y: torch.Tensor, n_classes: int,
                                  baseline: float = 0.0, n_steps: int = 32, max_per_class: int = 100,
                                  batch_size: int = 256) -> torch.Tensor:
    """Integrated gradients (captum) w.r.t. the true class, averaged over up to ``max_per_class`` images per class.

    Returns ``(n_classes, n_features)``; rows for classes without samples are zero.
    """
    from captum.attr import IntegratedGradients

    device = next(model.parameters()).device
    out = torch.zeros(n_classes, x.shape[1])
    with eval_mode(model), torch.inference_mode(False), torch.enable_grad():
        ig = IntegratedGradients(model)
        for k in range(n_classes):
            xs = x[y == k][:max_per_class].to(device).float().clone()
            if len(xs) == 0:
                continue
            parts = []
            for i in range(0, len(xs), batch_size):
                chunk = xs[i:i + batch_size]
                parts.append(ig.attribute(chunk, baselines=torch.full_like(chunk, baseline), target=k,
                                          n_steps=n_steps, internal_batch_size=batch_size).detach())
            out[k] = torch.cat(parts).mean(0).cpu()
    return out


def _spans(rows: list[int]) -> list[tuple[int, int]]:
    """Contiguous ``(first, last)`` runs of sorted row indices."""
    spans: list[tuple[int, int]] = []
    for row in rows:
        if spans and row == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], row)
        else:
            spans.append((row, row))
    return spans


def plot_integrated_gradients(attributions: dict[str, torch.Tensor], path, image_shape=(28, 28),
                              protected_mask=None) -> Path:
    """Class-averaged integrated gradients, one row per model, one column per class.

    ``protected_mask`` (boolean, ``n_features``) marks immutable pixels: the image rows that
    contain any protected pixel are outlined (dashed red).
    """
    labels = list(attributions)
    n_classes = next(iter(attributions.values())).shape[0]
    fig, axes = plt.subplots(len(labels), n_classes, figsize=(1.2 * n_classes, 1.35 * len(labels) + 0.5),
                             squeeze=False)
    protected_rows = []
    if protected_mask is not None:
        mask = np.asarray(protected_mask, dtype=bool).reshape(image_shape)
        protected_rows = np.flatnonzero(mask.any(1)).tolist()
    for r, label in enumerate(labels):
        values = attributions[label].numpy()
        scale = float(np.abs(values).max()) or 1.0
        for k in range(n_classes):
            ax = axes[r][k]
            ax.imshow(_image(values[k], image_shape), cmap="bwr", vmin=-scale, vmax=scale)
            for start, stop in _spans(protected_rows):
                ax.add_patch(matplotlib.patches.Rectangle((-0.5, start - 0.5), image_shape[1], stop - start + 1,
                                                          fill=False, edgecolor="red", lw=1.2, ls="--",
                                                          alpha=0.9))
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"class {k}", fontsize=8)
        axes[r][0].set_ylabel(label, fontsize=9)
    note = " (protected rows outlined in red)" if protected_rows else ""
    fig.suptitle(f"Integrated gradients averaged over test images per class{note}", fontsize=9)
    return _save(fig, path)


def plot_figure2(panels: dict[str, dict], path, image_shape=(28, 28), value_range=(-1.0, 1.0),
                 protected_mask=None, targets=(1, 2, 3, 4), attribution_classes=(5, 6, 7, 8, 9)) -> Path:
    """The paper's Figure 2: per model (rows), a factual, its counterfactuals for ``targets`` and the
    integrated gradients averaged over the test images of ``attribution_classes``.

    ``panels`` maps a label (``BL``/``CT``) to ``{"factual": (D,), "counterfactuals": (len(targets), D),
    "attributions": (len(attribution_classes), D)}``; protected pixel rows are outlined in red.
    """
    labels = list(panels)
    columns = 1 + len(targets) + len(attribution_classes)
    fig, axes = plt.subplots(len(labels), columns, figsize=(1.15 * columns, 1.35 * len(labels) + 0.5), squeeze=False)
    protected_rows = []
    if protected_mask is not None:
        protected_rows = np.flatnonzero(np.asarray(protected_mask, dtype=bool).reshape(image_shape).any(1)).tolist()
    for r, label in enumerate(labels):
        panel = panels[label]
        images = [panel["factual"], *panel["counterfactuals"]]
        titles = ["factual", *(f"→ {t}" for t in targets)]
        for c, (image, title) in enumerate(zip(images, titles)):
            ax = axes[r][c]
            ax.imshow(_image(image, image_shape), cmap="gray", vmin=value_range[0], vmax=value_range[1])
            if c == 0:
                for spine in ax.spines.values():
                    spine.set_edgecolor("tab:blue")
                    spine.set_linewidth(3)
            if r == 0:
                ax.set_title(title, fontsize=8)
        values = np.asarray(panel["attributions"], dtype=float)
        scale = float(np.abs(values).max()) or 1.0
        for j, k in enumerate(attribution_classes):
            ax = axes[r][1 + len(targets) + j]
            ax.imshow(_image(values[j], image_shape), cmap="bwr", vmin=-scale, vmax=scale)
            for start, stop in _spans(protected_rows):
                ax.add_patch(matplotlib.patches.Rectangle((-0.5, start - 0.5), image_shape[1], stop - start + 1,
                                                          fill=False, edgecolor="red", lw=1.0, ls="--"))
            if r == 0:
                ax.set_title(f"IG class {k}", fontsize=8)
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r][0].set_ylabel(label, fontsize=9)
    fig.suptitle("Plausibility: ECCo counterfactuals of a factual; actionability: integrated gradients "
                 "(protected rows in red)", fontsize=8)
    return _save(fig, path)


def figure2_panels(models: dict[str, tuple], datamodule, config, lambda_energy: float = 5.0,
                   factual_class: int = 0, targets=(1, 2, 3, 4), attribution_classes=(5, 6, 7, 8, 9)):
    """Inputs of :func:`plot_figure2`: ``models`` maps a label to ``(plausibility module, its constraints,
    protected module)``; the factual is the first test image of ``factual_class`` that every model predicts right."""
    from ct_lightning.evaluation.protocol import counterfactuals_per_class

    x, y = datamodule.x_test, datamodule.y_test
    candidates = torch.nonzero(y == factual_class).flatten()
    pick = int(candidates[0])
    for index in candidates.tolist():
        row = x[index:index + 1]
        if all(int(m[0](row).argmax(1)) == factual_class for m in models.values()):
            pick = index
            break
    factual = x[pick:pick + 1]
    keep = torch.isin(y, torch.tensor(attribution_classes))
    panels = {}
    for label, (module, constraints, protected_module) in models.items():
        grid = counterfactuals_per_class(module, factual, datamodule.n_classes, config=config,
                                         lambda_energy=lambda_energy, mutability=constraints.mutability,
                                         lower=constraints.lower, upper=constraints.upper)[0]
        attributions = integrated_gradients_by_class(protected_module, x[keep], y[keep], datamodule.n_classes)
        panels[label] = {"factual": factual[0], "counterfactuals": grid[list(targets)],
                         "attributions": attributions[list(attribution_classes)]}
    return panels


def is_image_data(n_features: int) -> bool:
    """Whether a flat feature vector is a square image worth plotting as such (e.g. MNIST's 784)."""
    side = int(math.isqrt(n_features))
    return n_features >= 64 and side * side == n_features


def _shown_counterfactuals(result, max_shown: int = 60, lambda_energy: float = 1.0):
    """Factuals, counterfactuals and targets of run 0 at the ``λ_egy`` closest to ``lambda_energy`` (valid ones)."""
    lams = np.unique(result.samples["lambda_energy"])
    lam = lams[np.argmin(np.abs(lams - lambda_energy))]
    rows = np.flatnonzero((result.samples["run"] == 0) & (result.samples["lambda_energy"] == lam)
                          & result.samples["valid"])[:max_shown]
    return result.factuals[rows], result.counterfactuals[rows], result.samples["target"][rows]


def evaluation_figures(models: dict[str, dict], datamodule, out_dir, convergence: dict[str, list[float]] | None = None,
                       prefix: str = "", n_image_factuals: int = 3) -> list[Path]:
    """All figures for evaluated models; returns the PNG paths written to ``out_dir``.

    ``models`` maps a label (``BL``, ``CT``, ...) to ``{"module", "result", "constraints"}`` (optional
    ``"title"``: the panel's model name when the label must differ, e.g. for a protected pair) with an
    :class:`~ct_lightning.evaluation.EvaluationResult` and :class:`~ct_lightning.evaluation.EvaluationConstraints`.
    Writes the 2-D decision boundaries (2-feature data), robust accuracy curves, the convergence
    shares (when ``convergence`` has histories) and, for square-image data, counterfactual grids
    and class-averaged integrated gradients.
    """
    out_dir = Path(out_dir)
    paths = []
    names = list(datamodule.feature_names) or ["x1", "x2"]
    if datamodule.n_features == 2:
        panels = []
        for label, entry in models.items():
            factuals, cfs, targets = _shown_counterfactuals(entry["result"])
            title = panel_title(entry.get("title", label), names, entry["constraints"].immutable)
            panels.append({"model": entry["module"], "title": title,
                           "factuals": factuals, "counterfactuals": cfs, "targets": targets})
        paths.append(plot_decision_boundaries(panels, out_dir / f"{prefix}decision_boundary.png", datamodule.x_train,
                                              datamodule.y_train, names[:2], suptitle=datamodule.name))
    curves = {label: entry["result"].robust_curve for label, entry in models.items()
              if entry["result"].robust_curve.get("epsilon")}
    if curves:
        paths.append(plot_robust_accuracy(curves, out_dir / f"{prefix}robust_accuracy.png",
                                          title=f"{datamodule.name}: accuracy under FGSM"))
    if convergence:
        paths.append(plot_convergence(convergence, out_dir / f"{prefix}convergence.png"))
    if is_image_data(datamodule.n_features):
        from ct_lightning.evaluation import counterfactuals_per_class

        side = math.isqrt(datamodule.n_features)
        lower, upper = datamodule.domain()
        value_range = (float(lower.min()), float(upper.max()))
        # One factual per class for the first classes, the same for every model.
        picks = [int(torch.nonzero(datamodule.y_test == k)[0]) for k in range(datamodule.n_classes)
                 if (datamodule.y_test == k).any()][:n_image_factuals]
        x = datamodule.x_test[picks]
        grids, attributions = {}, {}
        mask = None
        for label, entry in models.items():
            c = entry["constraints"]
            grids[label] = counterfactuals_per_class(entry["module"], x, datamodule.n_classes,
                                                     config=entry["result"].config, mutability=c.mutability,
                                                     lower=c.lower, upper=c.upper)
            attributions[label] = integrated_gradients_by_class(entry["module"], datamodule.x_test, datamodule.y_test,
                                                                datamodule.n_classes)
            if c.protected_mask.any():
                mask = c.protected_mask if mask is None else (mask | c.protected_mask)
        if mask is None and getattr(datamodule, "protected", None):
            from ct_lightning.constraints import parse_mutability

            codes = parse_mutability({f: "none" for f in datamodule.protected}, datamodule.n_features, names)
            mask = codes == 3
        paths.append(plot_counterfactual_grid(grids, out_dir / f"{prefix}counterfactuals.png", (side, side),
                                              value_range, factuals=x))
        paths.append(plot_integrated_gradients(attributions, out_dir / f"{prefix}integrated_gradients.png",
                                               (side, side), mask))
    return paths
