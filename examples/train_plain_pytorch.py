"""Train an ordinary PyTorch MLP on a lending CSV encoded by scikit-learn, and save its ``state_dict``: the model a
user already has.

The model reads the table as an ordinary scikit-learn pipeline encodes it, not as ct-lightning does: a
``ColumnTransformer`` that one-hot encodes the text columns first (``OneHotEncoder``) and standardises the numbers
after them (``StandardScaler``). ``--inputs`` writes which inputs that makes, in order, as JSON
(``ct_lightning.model_inputs.model_inputs_from_sklearn``, which reads the fitted transformer's numbers); with it,
``train.py --from-checkpoint model.pt --model-inputs model-inputs.json`` fine-tunes this model, and writes the
fine-tuned weights back for this very pipeline (``model-weights.pt`` beside the checkpoints):

  python examples/train_plain_pytorch.py loans.csv --target approved --out model.pt --inputs model-inputs.json
"""

from __future__ import annotations

import argparse
import json

import pandas as pd
import torch
from sklearn.compose import ColumnTransformer
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from torch import nn


def build_network(n_inputs: int, n_classes: int) -> nn.Sequential:
    """The user's own architecture: an MLP with two hidden layers (64, 32)."""
    return nn.Sequential(nn.Linear(n_inputs, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, n_classes))


def fit_preprocessing(features: pd.DataFrame) -> ColumnTransformer:
    """The user's own encoding: text columns one-hot (first), numbers standardised (after them)."""
    text = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    numbers = [c for c in features.columns if c not in text]
    return ColumnTransformer([("categories", OneHotEncoder(handle_unknown="ignore"), text),
                              ("numbers", StandardScaler(), numbers)]).fit(features)


def main(argv: list[str] | None = None) -> None:
    """Fit the encoding and the MLP, report the training accuracy, save the weights and the inputs list."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="the data, one row per applicant")
    parser.add_argument("--target", default="approved", help="the column to predict (default %(default)s)")
    parser.add_argument("--out", default="model.pt", help="where the state_dict goes (default %(default)s)")
    parser.add_argument("--inputs", default="model-inputs.json", help="where the list of the model's inputs goes, "
                        "for train.py --model-inputs (default %(default)s)")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    frame = pd.read_csv(args.csv, skipinitialspace=True)
    features = frame.drop(columns=[args.target])
    classes = sorted(frame[args.target].unique())  # label i is the i-th class in sort order, as ct-lightning's
    preprocess = fit_preprocessing(features)
    x = torch.tensor(preprocess.transform(features), dtype=torch.float32)
    y = torch.tensor(frame[args.target].map({c: i for i, c in enumerate(classes)}).to_numpy(), dtype=torch.long)
    model = build_network(x.shape[1], len(classes))
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(args.epochs):
        for batch in torch.randperm(len(x)).split(64):
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimiser.step()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    torch.save(model.state_dict(), args.out)

    from ct_lightning.model_inputs import model_inputs_from_sklearn  # noqa: PLC0415 - the one ct-lightning piece

    with open(args.inputs, "w") as handle:
        json.dump(model_inputs_from_sklearn(preprocess), handle, indent=1)
    print(f"saved {args.out}: MLP {x.shape[1]}-64-32-{len(classes)} on scikit-learn's encoding "
          f"({', '.join(preprocess.get_feature_names_out()[:3])}, ...), training accuracy {accuracy:.3f}; its inputs: "
          f"{args.inputs}")


if __name__ == "__main__":
    main()
