"""Apply MOVES.txt (the monarch.broker restructuring, issue 37) to a checkout.

Usage: python MOVES_rewrite.py FILE...   (rewrites in place; prints the files it changed)

Dotted paths (``monarch.broker.subjects``) and slash paths
(``monarch/broker/subjects.py``) are renamed by MOVES.txt's module lines;
``from monarch.broker import a, b as c`` is split into one line per new package
(run ``ruff check --fix --select I`` afterwards to sort imports). The moved
*names* (``module:Name`` lines, the process settings) are left to a person:
grep for ``monarch.broker.config`` / ``monarch.broker.settings``.
"""

from __future__ import annotations

import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
MODULES: dict[str, str] = {}
for line in (HERE / "MOVES.txt").read_text().splitlines():
    line = line.strip()
    if not line or line.startswith("#") or ":" in line:
        continue
    old, new = (s.strip() for s in line.split("->"))
    MODULES[old] = new

_DOTTED = re.compile(r"\bmonarch\.broker\.([A-Za-z_][A-Za-z0-9_]*)\b(?!\.py)")
_SLASHED = re.compile(r"\bmonarch/broker/([A-Za-z_][A-Za-z0-9_]*)\.py\b")
_FROM = re.compile(r"^([ \t]*)from monarch\.broker import ([^(\n]+?)([ \t]*#.*)?$", re.M)


def _dotted(m: re.Match[str]) -> str:
    old = "monarch.broker." + m.group(1)
    return MODULES.get(old, old)


def _slashed(m: re.Match[str]) -> str:
    old = "monarch.broker." + m.group(1)
    new = MODULES.get(old)
    return m.group(0) if new is None else new.replace(".", "/") + ".py"


def _from(m: re.Match[str]) -> str:
    indent, names, comment = m.group(1), m.group(2), m.group(3) or ""
    by_package: dict[str, list[str]] = {}
    for item in (s.strip() for s in names.split(",")):
        if not item:
            continue
        name = item.split(" as ")[0].strip()
        new = MODULES.get("monarch.broker." + name)
        package, _, module = (new or "monarch.broker." + name).rpartition(".")
        rest = item[len(name) :]
        by_package.setdefault(package, []).append(module + rest)
    lines = [f"{indent}from {p} import {', '.join(sorted(ns))}" for p, ns in by_package.items()]
    lines[0] += comment
    return "\n".join(lines)


def rewrite(text: str) -> str:
    text = _FROM.sub(_from, text)
    text = _SLASHED.sub(_slashed, text)
    return _DOTTED.sub(_dotted, text)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        path = pathlib.Path(arg)
        old = path.read_text()
        new = rewrite(old)
        if new != old:
            path.write_text(new)
            print(path)
