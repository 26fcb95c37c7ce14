#!/usr/bin/env python3
"""Checks the `Note [Title]` convention over the repository's tracked files: every reference
resolves to exactly one definition, no title is defined twice, and a reference that names a file
(`Note [Title] in dir/file.cpp`, or just `file.cpp`) names the file that defines it.

A definition is `Note [Title]` alone on its line (after `//` or `#`), the text below it saying
why; where no such line exists, a line that starts with `Note [Title]:` (a short Note, or one in
a Python docstring) is the definition. Every other `Note [Title]` is a reference, and may break
across lines inside a comment. Prints each problem as `file:line: ...` and exits 1 when there is
one.

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
# What follows a reference when it names the file of the definition: " in pipeline/x.cpp", the
# words possibly broken across comment lines.
NAMED_FILE = re.compile(r"(?: there)?,?(?:\s*\n\s*(?://|#)\s*|\s+)in(?:\s*\n\s*(?://|#)\s*|\s+)"
                        r"([\w./-]+\.(?:cpp|hpp|cu|py|cmake|sh|md))\b")


def names(named: str, where: str) -> bool:
    """Whether `named` ("pipeline/x.cpp" or "x.cpp") is the file of `where` ("path:line")."""
    path = where.rsplit(":", 1)[0]
    return path == named or path.endswith("/" + named)


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
                named = NAMED_FILE.match(text, m.end())
                references.append((title, where, named.group(1) if named else None))
    for title, places in leading.items():
        if title not in definitions:
            definitions[title] = places[:1]
            references += [(title, where, None) for where in places[1:]]
    problems = [f"{where}: Note [{title}] is referenced but defined nowhere"
                for title, where, _ in references if title not in definitions]
    problems += [f"{where}: Note [{title}] is said to be in {named}, but is defined at "
                 f"{definitions[title][0]}"
                 for title, where, named in references
                 if named and title in definitions and not names(named, definitions[title][0])]
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
