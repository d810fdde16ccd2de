"""A small hand-made codec for the explanation tests: income standardised, home one-hot, classes no/yes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ct_lightning.models import build_mlp


@dataclass
class Column:
    name: str
    kind: str
    mutability: str = "both"
    categories: list = field(default_factory=list)


class SmallCodec:
    """A hand-made codec for the test: income standardised, home one-hot (decoded to the largest entry)."""

    def __init__(self, immutable_home: bool = False):
        self.columns = [Column("income", "continuous"), Column("home", "categorical",
                                                               "none" if immutable_home else "both",
                                                               ["rent", "own", "mortgage"])]
        self.feature_names = ["income", "home=rent", "home=own", "home=mortgage"]
        self.classes, self.target = ["no", "yes"], "approved"
        self.mean, self.std = 50_000.0, 10_000.0

    def encode(self, frame):
        home = np.stack([(frame["home"] == c).to_numpy() for c in self.columns[1].categories], 1)
        return np.concatenate([((frame["income"].to_numpy(float) - self.mean) / self.std)[:, None], home], 1) \
            .astype(np.float32)

    def decode(self, x):
        x = np.asarray(x)
        return pd.DataFrame({"income": x[:, 0] * self.std + self.mean,
                             "home": [self.columns[1].categories[i] for i in x[:, 1:].argmax(1)]})

    def decode_target(self, codes):
        return [self.classes[int(c)] for c in np.asarray(codes)]

    def mutability(self):
        return {c.name: c.mutability for c in self.columns if c.mutability != "both"}


def model_of_income_and_home() -> torch.nn.Module:
    """Logits rising with income and with owning a home (class 1 = yes)."""
    model = build_mlp(4, 2, [])
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[-2.0, 0.5, -1.0, 0.0], [2.0, -0.5, 1.0, 0.0]]))
        model[0].bias.zero_()
    return model
