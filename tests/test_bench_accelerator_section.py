"""``bench/run.py --accelerator gpu``'s section of docs/performance.md, run on the CPU: every variant trains,
the tolerance check compares each with its objective's reference, and the section replaces only itself."""

import pytest

from bench.common import load_datamodule, machine_info, pick_device
from bench.gpu_section import END, START, compare, keep_section, render_section, run_accelerator_section, splice


def test_the_variants_train_and_are_compared_with_their_reference():
    datamodule = load_datamodule("circles")
    variants = (("vanilla", "off", False), ("vanilla", "off", True), ("full", "off", False), ("full", "off", True))
    results = run_accelerator_section({"circles": datamodule}, 2, "cpu", variants, log=lambda *a: None)
    rows = results["circles"]
    assert [(r["objective"], r["tf32"]) for r in rows] == [(o, t) for o, _, t in variants]
    for row in rows:
        assert len(row["train_s"]) == 2 and row["epoch_s"] > 0 and 0.0 <= row["val_acc"] <= 1.0
        # On a CPU, TF32 changes nothing: each variant is its reference.
        assert row["unchanged"] and row["loss_rel_diff"] == pytest.approx(0.0, abs=1e-6)
    text = render_section({"machine": machine_info(pick_device("cpu")), "epochs": 2, "elapsed_s": 1.0,
                           "accelerator": results}, "python bench/run.py --accelerator gpu")
    assert text.startswith(START) and text.rstrip().endswith(END) and text.count("| circles |") == 4


def test_compare_flags_a_variant_outside_the_tolerance():
    rows = [{"objective": "full", "train_loss": 1.0, "val_acc": 0.9},
            {"objective": "full", "train_loss": 1.01, "val_acc": 0.91},
            {"objective": "full", "train_loss": 1.2, "val_acc": 0.9},
            {"objective": "full", "train_loss": 1.0, "val_acc": 0.85}]
    compare(rows)
    assert [r["unchanged"] for r in rows] == [True, True, False, False]


def test_the_section_replaces_only_itself_and_a_cpu_report_keeps_it():
    section = f"{START}\n## Accelerator: X\nnew\n{END}\n"
    document = "# Performance\n\nCPU tables\n"
    once = splice(document, section)
    assert once.startswith(document.rstrip("\n")) and once.count(START) == 1
    twice = splice(once.replace("new", "old"), section)
    assert twice == once
    rerendered = keep_section(once, "# Performance\n\nnew CPU tables\n")
    assert "new CPU tables" in rerendered and "## Accelerator: X\nnew" in rerendered
    assert keep_section("# no section\n", "# Performance\n") == "# Performance\n"
