"""Train an ordinary PyTorch MLP on a lending CSV and save its ``state_dict``: the model a user already has.

The inputs are encoded the way ct-lightning encodes a CSV (``datamodules.codec.TabularCodec``: numbers
standardised, categories one-hot as ``column=value``), so that ``train.py --data loans.csv
--from-checkpoint model.pt`` can fine-tune it. Nothing else of ct-lightning is used.

  python examples/train_plain_pytorch.py loans.csv --target approved --out model.pt --epochs 20
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch
from torch import nn

from datamodules.codec import TabularCodec


def main(argv: list[str] | None = None) -> None:
    """Fit the encoding and the MLP, report the training accuracy, save the weights."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="the data, one row per applicant")
    parser.add_argument("--target", default="approved", help="the column to predict (default %(default)s)")
    parser.add_argument("--out", default="model.pt", help="where the state_dict goes (default %(default)s)")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    frame = pd.read_csv(args.csv)
    codec = TabularCodec.fit(frame, args.target)
    x = torch.from_numpy(codec.encode(frame.drop(columns=[args.target])))
    y = torch.as_tensor(codec.encode_target(frame[args.target]), dtype=torch.long)
    model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                          nn.Linear(32, len(codec.classes)))
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(args.epochs):
        for batch in torch.randperm(len(x)).split(64):
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimiser.step()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    torch.save(model.state_dict(), args.out)
    print(f"saved {args.out}: MLP {x.shape[1]}-64-32-{len(codec.classes)}, training accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
