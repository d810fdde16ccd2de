"""Write a realistic (synthetic) lending data set as a CSV: one row per loan applicant, no download.

Columns: age, income, debt, years_employed (integers), home_ownership (rent|mortgage|own),
purpose (car|debt_consolidation|education|home_improvement|small_business), sex (female|male) and
approved (yes|no). Approval follows the debt-to-income ratio, income, years employed, home ownership
and purpose, with noise; sex plays no part in it (so a model has no reason to use it).
--applicants writes new applications to decide instead: an applicant_id first (A0001, A0002, ...) and no approved
column, as a lender's file of this week's applications would hold them (another --seed than the training table's).

  python examples/make_lending_csv.py --out loans.csv --rows 5000 --seed 0
  python examples/make_lending_csv.py --out applicants.csv --rows 20 --seed 1 --applicants
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

PURPOSES = ["car", "debt_consolidation", "education", "home_improvement", "small_business"]
PURPOSE_EFFECT = {"car": 0.2, "debt_consolidation": -0.2, "education": 0.0, "home_improvement": 0.3,
                  "small_business": -0.6}
HOME_EFFECT = {"rent": -0.3, "mortgage": 0.2, "own": 0.5}


def make_loans(rows: int = 5000, seed: int = 0) -> pd.DataFrame:
    """``rows`` applicants drawn with ``seed``; the same arguments give the same frame."""
    rng = np.random.default_rng(seed)
    age = rng.integers(21, 71, rows)
    years_employed = np.minimum(rng.gamma(2.0, 4.0, rows).round().astype(int), age - 18)
    income = (np.exp(rng.normal(10.75, 0.45, rows)) * (1 + 0.01 * years_employed)).round(-2).astype(int)
    home = np.where(age < 30, rng.choice(["rent", "mortgage", "own"], rows, p=[0.7, 0.25, 0.05]),
                    rng.choice(["rent", "mortgage", "own"], rows, p=[0.3, 0.45, 0.25]))
    debt = (income * rng.beta(2.0, 5.0, rows) * 1.2).round(-2).astype(int)
    purpose = rng.choice(PURPOSES, rows, p=[0.25, 0.3, 0.1, 0.2, 0.15])
    sex = rng.choice(["female", "male"], rows)
    score = (1.5 - 5.0 * debt / income + 1.2 * (np.log(income) - 10.75) + 0.05 * years_employed
             + np.vectorize(HOME_EFFECT.get)(home) + np.vectorize(PURPOSE_EFFECT.get)(purpose))
    approved = rng.random(rows) < 1 / (1 + np.exp(-2.0 * score))
    return pd.DataFrame({"age": age, "income": income, "debt": debt, "years_employed": years_employed,
                         "home_ownership": home, "purpose": purpose, "sex": sex,
                         "approved": np.where(approved, "yes", "no")})


def main(argv: list[str] | None = None) -> None:
    """Write the CSV and say what is in it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="loans.csv", help="CSV file to write (default %(default)s)")
    parser.add_argument("--rows", type=int, default=5000, help="applicants (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    parser.add_argument("--applicants", action="store_true",
                        help="new applications: an applicant_id column first and no approved column")
    args = parser.parse_args(argv)
    if args.rows < 20:
        parser.error(f"--rows: got {args.rows}; allowed: an integer ≥ 20")
    frame = make_loans(args.rows, args.seed)
    if args.applicants:
        frame = frame.drop(columns="approved")
        frame.insert(0, "applicant_id", [f"A{i:04d}" for i in range(1, len(frame) + 1)])
        frame.to_csv(args.out, index=False)
        print(f"wrote {args.out}: {len(frame)} new applications (applicant_id first, no decision yet)")
        return
    frame.to_csv(args.out, index=False)
    print(f"wrote {args.out}: {len(frame)} applicants, {(frame['approved'] == 'yes').mean():.0%} approved")


if __name__ == "__main__":
    main()
