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


def _block_after(text: str, marker: str) -> str:
    """The fenced code block right after ``<!-- marker -->``."""
    rest = text[text.index(f"<!-- {marker} -->") :]
    start = rest.index("```")
    body = rest[rest.index("\n", start) + 1 :]
    return body[: body.index("```")]


def test_deployment_plan_in_the_docs_is_the_plan_commands_output(tmp_path, monkeypatch, capsys):
    """docs/deployment.md shows a plan: the printed block is what the shown command prints
    for the shown sites file (the deployment test runs the same commands on loopback)."""
    import shlex

    from strategies.runtime import deploy

    with open(os.path.join(DOCS, "deployment.md"), encoding="utf-8") as fh:
        text = fh.read()
    (tmp_path / "sites.csv").write_text(_block_after(text, "plan-sites"))
    command = shlex.split(_block_after(text, "plan-command"))
    assert command[:3] == ["python", "-m", "strategies.runtime.deploy"]
    monkeypatch.chdir(tmp_path)
    assert deploy.main(command[3:]) == 0
    assert capsys.readouterr().out == _block_after(text, "plan-output")
    for name in ("config.toml", "run_config.toml"):
        assert (tmp_path / "plan" / name).is_file()
