"""MkDocs hooks (``hooks:`` in mkdocs.yml).

- The repository's committed figures, ``reports/**/*.png``, join the site at ``reports/...``
  without being copied into docs/: a page in docs/results/ shows one as
  ``![...](../reports/toy/x.png)``.
- The code's docstrings cite objects with Sphinx roles (``:class:`AlgoConfig```), which
  mkdocstrings renders as the role's name followed by the code span; the name is dropped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPORTS = Path(__file__).resolve().parent.parent / "reports"
ROLE = re.compile(r":(?:class|func|mod|data|meth|attr|exc|obj):(?=<code>)")


def on_files(files: Files, config: Any) -> Files:
    for path in sorted(REPORTS.rglob("*.png")):
        uri = "reports/" + path.relative_to(REPORTS).as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_content(html: str, **kwargs: Any) -> str:
    return ROLE.sub("", html)
