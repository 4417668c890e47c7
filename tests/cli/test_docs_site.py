"""The documentation site (issue 56): ``mkdocs.yml`` builds the pages of ``docs/`` and an API
reference rendered from the docstrings, with ``--strict`` (a broken link, anchor or
cross-reference, or a page missing from the navigation, fails the build); the build reads the
source statically, importing neither Chandy nor Spark; and the README, the repository's own table
of contents, links only to files that exist and to every page."""

from __future__ import annotations

import ast
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import REPO_ROOT

DOCS = REPO_ROOT / "docs"

#: Builds the site as ``mkdocs build --strict`` does, then prints which modules of Chandy and Spark
#: the build imported (none: mkdocstrings reads the source with griffe's static analysis).
_BUILD = """
import json, logging, sys
from mkdocs.commands.build import build
from mkdocs.config import load_config

logging.basicConfig(level=logging.WARNING, format="%(levelname)s - %(message)s", stream=sys.stderr)
try:
    build(load_config(config_file=sys.argv[1], site_dir=sys.argv[2], strict=True))
except SystemExit as abort:  # mkdocs' Abort: "Aborted with N warnings in strict mode!"
    sys.exit(str(abort))
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in ("chandy", "pyspark"))))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-c", _BUILD, str(REPO_ROOT / "mkdocs.yml"), str(site_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-4000:]}"
    imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert imported == [], f"building the docs imported {imported}: the API reference must be read statically"
    return site_dir


def _text(page: Path) -> str:
    """A built page's words, tags dropped and white space collapsed."""
    body = re.sub(r"</?(code|a|span|em|strong)\b[^>]*>", "", page.read_text())  # inline: no space
    body = re.sub(r"<[^>]+>", " ", body)
    return " ".join(html.unescape(body).split())


def _first_paragraph(path: Path, qualname: str) -> str:
    """The first paragraph of a class's docstring, read from the source (not imported), as it
    reads once rendered: Sphinx roles and backquotes dropped, white space collapsed."""
    tree = ast.parse(path.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == qualname)
    doc = ast.get_docstring(node)
    assert doc, f"{qualname} has no docstring"
    paragraph = doc.split("\n\n", 1)[0]
    paragraph = re.sub(r":\w+:`~?\.?([^`]*)`", r"\1", paragraph).replace("`", "")
    return " ".join(paragraph.split())


def _nav_pages() -> list[str]:
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)


def test_every_page_of_docs_is_built(site: Path) -> None:
    for page in map(Path, _nav_pages()):
        built = site / (page.parent if page.name == "index.md" else page.with_suffix("")) / "index.html"
        assert built.is_file(), f"{page} was not built ({built})"


@pytest.mark.parametrize(("page", "source", "name"), [
    ("reference/formats", "chandy/formats/decoder.py", "ValueDecoder"),
    ("reference/coordinator/checkpoint_coordinator", "chandy/coordinator/checkpoint_coordinator.py", "CheckpointCoordinator"),
    ("reference/coordinator/kafka/runtime", "chandy/coordinator/kafka/runtime.py", "CoordinatorService"),
    ("reference/coordinator/kafka/participant", "chandy/coordinator/kafka/participant.py", "CheckpointParticipant"),
    ("reference/connectors/spark/options", "chandy/connectors/spark/options.py", "PipelineOptions"),
    ("reference/connectors/lake/sink", "chandy/connectors/lake/sink.py", "LakeSink"),
    ("reference/chandy", "chandy/coordinator/options.py", "CheckpointingOptions"),
])
def test_the_api_reference_holds_the_docstrings(site: Path, page: str, source: str, name: str) -> None:
    text = _text(site / page / "index.html")
    assert _first_paragraph(REPO_ROOT / source, name) in text
    assert re.search(rf"\b{name}\b", text)


def test_the_api_reference_shows_parameters_and_no_sphinx_roles(site: Path) -> None:
    text = _text(site / "reference/coordinator/checkpoint_coordinator/index.html")
    # the Args section of CheckpointCoordinator, rendered as parameters with their descriptions
    assert "operator ID -> parallelism of every operator whose subtasks acknowledge" in text
    for page in (site / "reference").rglob("*.html"):
        assert not re.search(r":(class|mod|func|meth|data|attr|exc):<code>", page.read_text()), page


def test_every_relative_link_of_the_readme_exists_and_every_page_is_linked() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    relative = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert relative
    missing = [t for t in relative if not (REPO_ROOT / t).exists()]
    assert missing == [], f"README.md links to files that do not exist: {missing}"
    linked = {str(Path(t)) for t in relative}
    unlinked = [p for p in _nav_pages() if str(Path("docs") / p) not in linked
                and not (p.startswith("reference/") and p != "reference/index.md")]
    assert unlinked == [], f"README.md's table of contents misses {unlinked}"
