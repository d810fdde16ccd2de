"""A variational autoencoder for latent-space counterfactual search (REVISE), with an on-disk cache.

The VAE is a ``LightningModule`` of its own (Gaussian encoder, deterministic decoder, loss =
squared reconstruction error + β·KL). :func:`load_or_train_vae` trains it on a data set's
training split once and caches the weights; the cache key covers the data set name, the
feature count, a hash of the training data and every training setting, so a changed data set
or setting trains a new VAE. Cache files are written atomically (temporary file + rename).

Cache folder: the ``cache_dir`` argument, else ``$CT_CACHE_DIR/vae``, else
``$XDG_CACHE_HOME/ct-lightning/vae`` (``~/.cache/ct-lightning/vae`` when XDG_CACHE_HOME is unset).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ct_lightning.models import build_mlp

CACHE_DIR_ENV = "CT_CACHE_DIR"
CACHE_VERSION = 1


class VAEModule(L.LightningModule):
    """Gaussian VAE on flat feature vectors: ``encode`` → ``(μ, log σ²)``, ``decode(z)`` → ``x``.

    Trained by minimising ``‖dec(z) − x‖² + β·KL(q(z|x) ‖ N(0, I))`` per sample (summed over
    features, averaged over the batch) with the reparameterisation trick.
    """

    def __init__(self, n_features: int, latent_dim: int = 8, hidden_sizes: tuple[int, ...] | list[int] = (64, 64),
                 beta: float = 0.1, lr: float = 1e-3):
        super().__init__()
        hidden_sizes = list(hidden_sizes)
        self.save_hyperparameters()
        self.encoder = build_mlp(n_features, hidden_sizes[-1], hidden_sizes[:-1]) if hidden_sizes else nn.Sequential()
        self.encoder.append(nn.ReLU())
        self.mean = nn.Linear(hidden_sizes[-1] if hidden_sizes else n_features, latent_dim)
        self.log_var = nn.Linear(hidden_sizes[-1] if hidden_sizes else n_features, latent_dim)
        self.decoder = build_mlp(latent_dim, n_features, list(reversed(hidden_sizes)))

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of ``q(z | x)``."""
        h = self.encoder(x)
        return self.mean(h), self.log_var(h)

    def encode_mean(self, x: torch.Tensor) -> torch.Tensor:
        """The posterior mean ``enc_mean(x)``, where REVISE starts its search."""
        return self.encode(x)[0]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Map latent codes back to the feature space."""
        return self.decoder(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Deterministic reconstruction ``dec(enc_mean(x))``."""
        return self.decode(self.encode_mean(x))

    def loss(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Negative ELBO terms of a batch: ``loss``, ``recon`` and ``kl`` (means over the batch)."""
        mean, log_var = self.encode(x)
        z = mean + torch.randn_like(mean) * (0.5 * log_var).exp()
        recon = F.mse_loss(self.decode(z), x, reduction="none").sum(1).mean()
        kl = 0.5 * (mean.square() + log_var.exp() - 1.0 - log_var).sum(1).mean()
        return {"loss": recon + self.hparams.beta * kl, "recon": recon, "kl": kl}

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        """One ELBO step; logs ``vae/loss``, ``vae/recon``, ``vae/kl``."""
        terms = self.loss(batch[0])
        for name, value in terms.items():
            self.log(f"vae/{name}", value, on_step=False, on_epoch=True, batch_size=len(batch[0]))
        return terms["loss"]

    def configure_optimizers(self):
        """Adam with the configured learning rate."""
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


@dataclass
class VAESettings:
    """Architecture and training settings of a cached VAE; all of them enter the cache key."""

    latent_dim: int = 8
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    beta: float = 0.1
    lr: float = 1e-3
    epochs: int = 30
    batch_size: int = 128
    seed: int = 0

    def __post_init__(self):
        self.hidden_sizes = [int(h) for h in self.hidden_sizes]
        if self.latent_dim < 1 or self.epochs < 1 or self.batch_size < 1:
            raise ValueError("vae: latent_dim, epochs and batch_size must be at least 1")


def default_cache_dir() -> Path:
    """``$CT_CACHE_DIR/vae``, else ``$XDG_CACHE_HOME/ct-lightning/vae`` (``~/.cache/...`` when unset)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser() / "vae"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "ct-lightning" / "vae"


def data_hash(x: torch.Tensor) -> str:
    """SHA-256 of the training data (shape, dtype and bytes)."""
    x = x.detach().cpu().contiguous().float()
    digest = hashlib.sha256(f"{tuple(x.shape)}".encode())
    digest.update(x.numpy().tobytes())
    return digest.hexdigest()


def cache_key(name: str, x_train: torch.Tensor, settings: VAESettings) -> str:
    """Key of a VAE: data set name, feature count, data hash and settings."""
    payload = {"version": CACHE_VERSION, "name": name, "n_features": int(x_train.shape[1]),
               "data": data_hash(x_train), "settings": asdict(settings)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cache_path(name: str, x_train: torch.Tensor, settings: VAESettings, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the VAE for these data and settings is (or would be) cached."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name) or "data"
    key = cache_key(name, x_train, settings)
    return Path(cache_dir or default_cache_dir()).expanduser() / f"{safe}-{x_train.shape[1]}f-{key[:20]}.pt"


def save_atomic(vae: VAEModule, path: Path, metadata: dict) -> None:
    """Write the VAE's weights and hyperparameters to ``path`` via a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        torch.save({"state_dict": {k: v.cpu() for k, v in vae.state_dict().items()},
                    "hparams": dict(vae.hparams), "metadata": metadata}, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_vae(path: str | os.PathLike) -> VAEModule:
    """Rebuild a cached VAE (eval mode, on the CPU)."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    vae = VAEModule(**payload["hparams"])
    vae.load_state_dict(payload["state_dict"])
    return vae.eval()


def train_vae(x_train: torch.Tensor, settings: VAESettings | None = None, accelerator: str = "cpu") -> VAEModule:
    """Fit a :class:`VAEModule` on ``x_train`` with a quiet Lightning ``Trainer``.

    Training is seeded with ``settings.seed`` inside a forked RNG state, so the caller's random
    streams are the same whether the VAE was trained or loaded from the cache.
    """
    settings = settings or VAESettings()
    x_train = x_train.detach().cpu().float()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        vae = VAEModule(x_train.shape[1], settings.latent_dim, settings.hidden_sizes, settings.beta, settings.lr)
        loader = DataLoader(TensorDataset(x_train), batch_size=settings.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(settings.seed))
        trainer = L.Trainer(max_epochs=settings.epochs, accelerator=accelerator, devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(vae, loader)
    return vae.cpu().eval()


def load_or_train_vae(x_train: torch.Tensor, name: str = "data", settings: VAESettings | None = None,
                      cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                      accelerator: str = "cpu") -> tuple[VAEModule, dict]:
    """The VAE for ``x_train``: loaded from the cache when present, else trained (and cached).

    Returns ``(vae, info)`` with ``info = {"path", "loaded"}``; ``loaded`` tells whether the
    cache was used. ``use_cache=False`` always trains and writes nothing.
    """
    settings = settings or VAESettings()
    path = cache_path(name, x_train, settings, cache_dir)
    if use_cache and path.is_file():
        try:
            return load_vae(path), {"path": str(path), "loaded": True}
        except Exception:  # noqa: BLE001 - a corrupt or foreign file: train anew and overwrite it
            pass
    vae = train_vae(x_train, settings, accelerator)
    if use_cache:
        save_atomic(vae, path, {"name": name, "n_features": int(x_train.shape[1]), "settings": asdict(settings)})
    return vae, {"path": str(path), "loaded": False}
