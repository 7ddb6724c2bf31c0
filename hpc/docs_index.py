#!/usr/bin/env python3
"""Write docs/index.md, the site's home page, from README.md.

    python hpc/docs_index.py            # writes docs/index.md
    python hpc/docs_index.py --check    # exit status 1 if docs/index.md is out of date

README.md is the one source: the home page is the README with its links made relative to docs/
(`docs/x.md` becomes `x.md`) and its link to the home page itself dropped. tests/test_docs.py fails
when docs/index.md is not this script's output.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
INDEX = os.path.join(ROOT, "docs", "index.md")
NOTICE = "<!-- Generated from README.md by `python hpc/docs_index.py`: edit README.md, then run it. -->"


def index_markdown(readme: str) -> str:
    """Return the home page for the README's text."""
    # The home page does not link itself: drop the link and the comma that follows it.
    text = re.sub(r"\[[^\]]*\]\(docs/index\.md\),?[ \t]*", "", readme)
    text = re.sub(r"\]\(docs/", "](", text)
    return f"{NOTICE}\n\n{text}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Write docs/index.md (or, with --check, say whether it is up to date)."""
    parser = argparse.ArgumentParser(prog="python hpc/docs_index.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that docs/index.md is up to date")
    args = parser.parse_args(argv)
    with open(README, encoding="utf-8") as fh:
        page = index_markdown(fh.read())
    if args.check:
        with open(INDEX, encoding="utf-8") as fh:
            current = fh.read()
        if current != page:
            print("docs/index.md is out of date: run `python hpc/docs_index.py`", file=sys.stderr)
            return 1
        return 0
    with open(INDEX, "w", encoding="utf-8") as fh:
        fh.write(page)
    print("wrote docs/index.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
