"""docs/guide.md's worked example of letters to applicants (*Columns and codes in words*), run as written at a tiny
size: the lending table and this week's applications from examples/make_lending_csv.py, examples/loans-words.yaml,
train.py, then explain.py --letters. Each letter offers only changes an applicant can make: income up and debt down
in the spec's steps, time in employment up to age − 18, in the applicant's units, with the held facts listed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
# the only change to the guide's commands: a smaller table and a shorter training (a later option wins)
SIZES = {"--out loans.csv": "--rows 600", "recipes/train.py": "--max-epochs 3 --nce 32 --no-progress"}


def guide_commands() -> list[str]:
    """The worked example's commands, as docs/guide.md gives them (continued lines joined, comments left out)."""
    text = (ROOT / "docs" / "guide.md").read_text()
    section = text[text.index("#### Worked example: a letter to each applicant"):]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1).replace("\\\n", " ")
    return [re.sub(r"\s+#.*$", "", line) for line in block.splitlines() if line.strip() and not line.startswith("#")]


def money(text: str) -> int:
    return int(text.replace(",", "").removeprefix("$"))


@pytest.mark.slow  # four fresh interpreters and a training
def test_the_guides_letters_offer_only_changes_an_applicant_can_make(tmp_path):
    commands = guide_commands()
    assert [c.split()[1] for c in commands] == ["examples/make_lending_csv.py", "examples/make_lending_csv.py",
                                                "recipes/train.py", "recipes/explain.py"]
    assert "--data-spec examples/loans-words.yaml" in commands[2] and "--letters letters" in commands[3]
    for name in (".venv", "examples", "recipes"):
        (tmp_path / name).symlink_to(ROOT / name)
    script = "\n".join(c + "".join(f" {extra}" for key, extra in SIZES.items() if key in c) for c in commands)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": "", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    applicants = pd.read_csv(tmp_path / "applicants.csv").set_index("applicant_id")
    assert "approved" not in applicants.columns and len(applicants) == 20
    letters = sorted((tmp_path / "letters").iterdir())
    assert letters, output[-4000:]
    assert re.search(rf"wrote {len(letters)} letter\(s\) to letters/", output)
    offered = 0
    for path in letters:
        ident = re.fullmatch(r"applicant_id-(A\d{4})\.txt", path.name).group(1)
        row, text = applicants.loc[ident], path.read_text()
        lines = text.splitlines()
        assert lines[0] == f"Your application (applicant id {ident})"
        assert "the model assessed your application as declined (probability" in " ".join(lines)
        held = lines[lines.index("These facts were held as they are:") + 1:]
        assert held[0] == f"  - Age (years): {row['age']}" and held[4] == ""
        assert {line.split(":")[0] for line in held[1:4]} == {"  - Home", "  - Purpose of the loan", "  - Sex"}
        assert all(len(line) <= 78 for line in lines)
        changes = dict(re.findall(r"  - (Yearly income|Debt owed|Time in employment \(years\)): "
                                  r"from (\$?[\d,]+ to \$?[\d,]+)", text))  # amounts in dollars as money: $37,200
        if "would assess it as approved" in text:
            offered += 1
            assert changes, text
        for name, span in changes.items():
            assert (name == "Time in employment (years)") == ("$" not in span), text
            before, after = (money(part) for part in span.split(" to "))
            if name.startswith("Yearly income"):
                assert before == row["income"] and after > before and (after - before) % 1000 == 0, text
            elif name.startswith("Debt owed"):
                assert before == row["debt"] and 0 <= after < before and (before - after) % 100 == 0, text
            else:
                assert before == row["years_employed"] and before < after <= row["age"] - 18, text
        assert not re.search(r"  - (Age|Home|Purpose of the loan|Sex)[^:]*: from ", text)  # held facts never change
    assert offered, "no letter offers a change"


def test_valid_explanations_below_the_asked_tau_are_named_in_a_note(tmp_path, capsys):
    """The lending walk with --tau 0.75: one letter said 'approved (probability 0.74)' and the console 'valid' with no
    word that the search stopped short of the 0.75 asked for (the domain, the held columns and the steps stopped it).
    A note now names such rows with their probability; none where every valid explanation reaches tau."""
    from ct_lightning.evaluation.explanation import probability_text
    from recipes.explain import main as explain_main
    from recipes.train import main as train_main

    fixture = ROOT / "tests" / "fixtures" / "loans.csv"
    spec = ROOT / "examples" / "loans-words.yaml"
    train_main(["--data", str(fixture), "--target", "approved", "--data-spec", str(spec), "--max-epochs", "10",
                "--nce", "32", "--no-progress", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
                "--checkpoint-dir", str(tmp_path / "ct")])
    rows = tmp_path / "rows.csv"
    pd.read_csv(fixture).head(30).to_csv(rows, index=False)
    capsys.readouterr()
    common = ["--checkpoint", str(tmp_path / "ct" / "last.ckpt"), "--rows", str(rows), "--only-predicted", "declined",
              "--max-steps", "60"]
    records = explain_main([*common, "--tau", "0.9"])
    out = capsys.readouterr().out
    short = [r for r in records if r["explained"] and r["valid"] and r["probability"] < 0.9]
    valid = sum(bool(r["explained"] and r["valid"]) for r in records)
    assert short, "no valid explanation below tau 0.9: the test shows nothing"
    [note] = [line for line in out.splitlines() if "below tau 0.9 " in line]
    assert note.startswith(f"note: {len(short)} of the {valid} valid explanations "), note
    first = short[0]
    assert f"(row {first['row']}: {probability_text(first['probability'])}" in note, note
    assert note.endswith("the model predicts the target there, less surely than asked; more search steps "
                         "(--max-steps) or a larger --search-lr may reach it"), note
    explain_main([*common, "--tau", "0.5"])  # every valid explanation of two classes reaches 0.5
    assert "below tau" not in capsys.readouterr().out
