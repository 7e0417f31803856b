"""A name given twice: ``optimize`` refuses two operators with one release key, before it
writes anything (``--range``'s producers given twice: tests/test_optimize_range.py)."""

from __future__ import annotations

import pytest

from kpair.errors import UsageError
from kpair.optimize.program import optimize
from kpair.optimize.strategy import first_repeat
from kpair.optimize.workbench import Operator


def test_first_repeat_names_the_first_name_given_twice():
    assert first_repeat(["a", "b", "b", "a"]) == "a"
    assert first_repeat(["a", "b", "c", "b"]) == "b"
    assert first_repeat(["a", "b"]) is None and first_repeat([]) is None


def test_two_operators_with_one_key_are_refused_before_anything_is_written(tmp_path):
    ops = [Operator(1, "add", snapshot=tmp_path / "x"), Operator(2, "add", snapshot=tmp_path / "y"),
           Operator(1, "add", snapshot=tmp_path / "z")]
    with pytest.raises(UsageError, match="two operators would both be level1/add"):
        optimize(ops, tmp_path / "rel", tmp_path / "work", report=False)
    assert not (tmp_path / "rel").exists() and not (tmp_path / "work").exists()
