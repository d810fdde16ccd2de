"""REVISE (Joshi et al. 2019): counterfactual search in the latent space of a cached VAE."""

from ct_lightning.generators.revise.latent import Revise, latent_search
from ct_lightning.generators.revise.vae import VAEModule, VAESettings, load_or_train_vae

__all__ = ["Revise", "VAEModule", "VAESettings", "latent_search", "load_or_train_vae"]
