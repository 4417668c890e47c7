"""MkDocs hook: Chandy's docstrings name code with Sphinx roles (``:class:`Name```, ``:mod:`~.read```),
which Markdown leaves as text before the code span. Keep the code span only, shortened as Sphinx
shows it (``~a.b.C`` shows ``C``; a relative ``.read`` shows ``read``), and end an RST literal
block's introducing ``::`` with one colon."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|type|ref):<code>([^<]*)</code>")
_LITERAL_INTRO = re.compile(r"::</p>(\s*<div[^>]*>\s*<pre)")


def _shown(match: re.Match[str]) -> str:
    target = match.group(1)
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"<code>{target.lstrip('.')}</code>"


def on_page_content(html: str, **_: Any) -> str:
    return _LITERAL_INTRO.sub(r":</p>\1", _ROLE.sub(_shown, html))
