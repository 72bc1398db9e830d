"""`import finetune.run` loads none of the optional libraries a plain run does not need
(benchmarks/import_time.py measures what the import costs)."""

from benchmarks.import_time import OPTIONAL, optional_loaded


def test_a_plain_run_imports_no_optional_library():
    assert "optuna" in OPTIONAL and "matplotlib" in OPTIONAL
    assert optional_loaded() == []
