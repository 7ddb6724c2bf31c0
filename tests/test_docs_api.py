"""The Python API page, generated from the docstrings of psframework/api.py."""

from __future__ import annotations

import psframework
from psframework.api_reference import PAGE, api_markdown, markdown_of


def test_the_api_page_is_the_generated_one():
    with open(PAGE, encoding="utf-8") as fh:
        assert fh.read() == api_markdown(), "docs/api.md is stale: run `python -m psframework.api_reference`"


def test_the_page_documents_every_public_name_and_the_launch_line():
    page = api_markdown()
    assert "psframework.train_module(model: nn.Module" in page and callable(psframework.train_module)
    assert "## Model factories" in page and "## Dataset factories" in page
    assert "mpiexec -n 5 python -m mpi4py my_script.py" in page


def test_an_indented_docstring_block_becomes_one_python_block():
    doc = "Do it.\n\n    a = 1\n\n    b = 2\nAfter."
    assert markdown_of(doc) == ["Do it.", "", "```python", "a = 1", "b = 2", "```", "", "After."]
