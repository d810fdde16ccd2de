"""REVISE (Joshi et al. 2019): counterfactual search in the latent space of a cached VAE."""

from ct_lightning.generators.revise.latent import Revise, latent_search

LAZY = ("VAEModule", "VAESettings", "load_or_train_vae")  # from vae, which imports Lightning: on first use


def __getattr__(name: str):
    """``VAEModule``, ``VAESettings`` and ``load_or_train_vae`` of ``vae``, imported on first use (the generator
    catalogue imports this package, and explaining a decision needs no Lightning)."""
    if name in LAZY:
        from ct_lightning.generators.revise import vae  # noqa: PLC0415

        return getattr(vae, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Revise", "VAEModule", "VAESettings", "latent_search", "load_or_train_vae"]
