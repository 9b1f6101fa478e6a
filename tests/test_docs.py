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


def _public_callables():
    """``(qualified name, function)`` of every public function and method of the three
    packages that takes two or more parameters and does not override a base class's
    method (an override inherits its base's documentation)."""
    import inspect
    import pkgutil

    for pkg in ("strategies", "grauc_flower", "rowfed_flower"):
        root = importlib.import_module(pkg)
        names = [pkg] + [m.name for m in pkgutil.walk_packages(root.__path__, f"{pkg}.")]
        for name in names:
            if name.endswith("__main__"):
                continue
            module = importlib.import_module(name)
            for attr, obj in vars(module).items():
                if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                    continue
                if inspect.isfunction(obj):
                    yield f"{name}.{attr}", obj
                elif inspect.isclass(obj):
                    for meth, fn in vars(obj).items():
                        fn = getattr(fn, "__func__", fn)
                        if meth.startswith("_") or not inspect.isfunction(fn):
                            continue
                        if any(meth in vars(base) for base in obj.__mro__[1:]):
                            continue
                        yield f"{name}.{attr}.{meth}", fn


def _parameters(fn) -> list[str]:
    import inspect

    return [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]


def test_public_functions_document_their_parameters():
    """numpydoc: every public function and method of two or more parameters has a
    ``Parameters`` section that names each of them."""
    checked, missing = 0, []
    for qualname, fn in _public_callables():
        params = _parameters(fn)
        if len(params) < 2:
            continue
        checked += 1
        doc = fn.__doc__ or ""
        if "Parameters\n" not in doc:
            missing.append(qualname)
            continue
        section = doc.split("Parameters\n", 1)[1]
        absent = [p for p in params if p.lstrip("*") not in section]
        if absent:
            missing.append(f"{qualname}: {absent}")
    assert checked > 300
    assert missing == []
