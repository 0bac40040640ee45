"""MkDocs hooks for the documentation site (mkdocs.yml names this file).

The docstrings cross-reference in Sphinx's roles (``:func:`fetch_shard```),
which mkdocstrings leaves as text: ``:func:`` before the name. This drops the
role and keeps the name as code, so the API reference reads as the source
means it. Nothing here touches the network: the site builds offline.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|data|attr|exc|obj|const):<code>~?")


def on_page_content(html: str, **_: Any) -> str:
    """Drop Sphinx roles in front of inline code in every rendered page."""
    return _ROLE.sub("<code>", html)
