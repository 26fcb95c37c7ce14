#!/usr/bin/env python3
"""Checks the `Note [Title]` convention over the repository's tracked files: every reference
resolves to exactly one definition, and no title is defined twice.

A definition is `Note [Title]` alone on its line (after `//` or `#`), the text below it saying
why; where no such line exists, a line that starts with `Note [Title]:` (a short Note, or one in
a Python docstring) is the definition. Every other `Note [Title]` is a reference, and may break
across lines inside a comment. Prints each problem as `file:line: ...` and exits 1 when there is one.

    python3 tools/scripts/check_notes.py [REPO]
"""

import pathlib
import re
import subprocess
import sys

SUFFIXES = {".cpp", ".hpp", ".cu", ".py", ".sh", ".md", ".txt", ".yaml", ".cmake"}
# This checker and its test write about Notes rather than cite them; "Title" is the placeholder
# the docs use to show the convention.
SKIPPED_FILES = {"tools/scripts/check_notes.py", "tests/python/test_notes.py"}
PLACEHOLDER = "Title"
ALONE = re.compile(r"^[ \t]*(?://|#)[ \t]*Note \[([^\]\n]+)\][ \t]*$", re.M)
LEADING = re.compile(r"^[ \t]*(?:(?://|#)[ \t]*)?Note \[([^\]\n]+)\]:", re.M)
MENTION = re.compile(r"Note \[([^\]]+?)\]", re.S)
CONTINUATION = re.compile(r"\s*\n\s*(?://|#|\*)?\s*")


def check(root: pathlib.Path) -> list:
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=root,
                             check=True).stdout.split()
    definitions, leading, references = {}, {}, []
    for name in tracked:
        path = root / name
        if (path.suffix not in SUFFIXES and path.name != "CMakeLists.txt") or \
                name in SKIPPED_FILES:
            continue
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        alone = {m.start(1) for m in ALONE.finditer(text)}
        leads = {m.start(1) for m in LEADING.finditer(text)}
        for m in MENTION.finditer(text):
            title = CONTINUATION.sub(" ", m.group(1)).strip()
            if title == PLACEHOLDER:
                continue
            where = f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
            if m.start(1) in alone:
                definitions.setdefault(title, []).append(where)
            elif m.start(1) in leads:
                leading.setdefault(title, []).append(where)
            else:
                references.append((title, where))
    for title, places in leading.items():
        if title not in definitions:
            definitions[title] = places[:1]
            references += [(title, where) for where in places[1:]]
    problems = [f"{where}: Note [{title}] is referenced but defined nowhere"
                for title, where in references if title not in definitions]
    problems += [f"{places[1]}: Note [{title}] is defined again (first at {places[0]})"
                 for title, places in definitions.items() if len(places) > 1]
    return problems


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = check(root)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
