"""`import finetune.run` loads none of the optional libraries a plain run does not need
(benchmarks/import_time.py measures what the import costs), and an evaluation's import adds no ONNX library:
onnx, onnxruntime and onnxscript are imported by the ONNX export and --onnx alone (finetune/onnx_export.py)."""

import pytest

from benchmarks.import_time import OPTIONAL, loaded_after, optional_loaded

ONNX = ("onnx", "onnxruntime", "onnxscript")


def test_a_plain_run_imports_no_optional_library_and_an_evaluation_no_onnx():
    """One fresh interpreter (each costs seconds of imports): `import finetune.run`, then
    `import finetune.evaluate_checkpoint`; what each leaves loaded."""
    assert "optuna" in OPTIONAL and "matplotlib" in OPTIONAL and {"onnx", "onnxruntime"} <= set(OPTIONAL)
    after_run, after_evaluation = loaded_after(["finetune.run", "finetune.evaluate_checkpoint"], [*OPTIONAL, *ONNX])
    assert after_run == []
    assert [lib for lib in after_evaluation if lib in ONNX] == []


def test_optional_loaded_is_the_first_import_of_loaded_after(monkeypatch):
    """The benchmark's own report (`optional_loaded`) asks the same probe, for `import finetune.run` alone."""
    import benchmarks.import_time as import_time

    asked = []
    monkeypatch.setattr(import_time, "loaded_after", lambda modules, libraries: asked.append((modules, libraries)) or [["x"]])
    assert optional_loaded() == ["x"] and asked == [(["finetune.run"], OPTIONAL)]


def test_by_package_sums_each_modules_own_import_time_by_its_top_level_package():
    """The benchmark's profile of an import: `-X importtime`'s self times, by package, largest first."""
    from benchmarks.import_time import by_package

    spent = by_package("import json.decoder, email.utils")
    assert {"json", "email"} <= set(spent) and all(t >= 0 for t in spent.values())
    assert "json.decoder" not in spent and list(spent.values()) == sorted(spent.values(), reverse=True)


@pytest.mark.parametrize("argv, fragment", [(["--reps", "0"], "--reps must be positive, got 0"),
                                            (["--out", "{file}"], "is a file; give a directory for the report")])
def test_a_bad_argument_is_one_line_before_anything_is_timed(argv, fragment, tmp_path, capsys):
    import benchmarks.import_time as import_time

    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(SystemExit) as exited:
        import_time.main([a.format(file=afile) for a in argv] + ([] if "--out" in argv else ["--out", str(tmp_path)]))
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err
    assert afile.read_text() == "mine"
