"""The documentation names only code that exists: every ``path.py: name`` reference in
``docs/*.md`` (names separated by commas; ``Class.attr`` allowed) resolves to a module
attribute, and the README links only files of the repository."""

from __future__ import annotations

import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
REF = re.compile(r"`([a-z_]+(?:/[a-z_]+)*\.py): ([A-Za-z_][\w.]*(?:, [A-Za-z_][\w.]*)*)`")


def _references():
    for name in sorted(os.listdir(DOCS)):
        if not name.endswith(".md"):
            continue
        with open(os.path.join(DOCS, name), encoding="utf-8") as fh:
            text = fh.read()
        for path, names in REF.findall(text):
            for attr in names.split(", "):
                yield name, path, attr


REFERENCES = list(_references())


def test_docs_have_references():
    assert len(REFERENCES) > 40  # the architecture table alone has more


@pytest.mark.parametrize(("doc", "path", "attr"), REFERENCES)
def test_reference_exists(doc, path, attr):
    assert os.path.isfile(os.path.join(ROOT, path)), (doc, path)
    module = importlib.import_module(path[:-3].replace("/", "."))
    obj = module
    for part in attr.split("."):
        assert hasattr(obj, part), f"{doc}: {path}: {attr}"
        obj = getattr(obj, part)


def test_readme_links_exist():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    links = re.findall(r"\]\(([^)#:]+)\)", text)
    assert links
    for link in links:
        assert os.path.exists(os.path.join(ROOT, link)), link
    assert "METHODS.md" not in text and "../shared" not in text
