#!/usr/bin/env python3
"""Checks that the files the Markdown documents cite exist in the repository: relative links
(`[text](path)`), paths written in backquotes under one of the repository's folders
(`tools/bench/x.py`; `storage/output_folder` for the .hpp/.cpp pair), and bare file names in
backquotes with a source or document extension (`test_resume.py`, `benchmarks.md`). Prints each
missing one as `file:line: ...` and exits 1 when there is one.

    python3 tools/scripts/check_doc_references.py [REPO]
"""

import os
import pathlib
import re
import subprocess
import sys

LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
QUOTED = re.compile(r"`([A-Za-z0-9_.\-/]+)`")
FOLDERS = ("tools/", "tests/", "docs/", "pipeline/", "storage/", "encoders/", "python/",
           "configs/", "examples/", "cmake/", ".ci/")
# A bare file name with one of these is the repository's (a user's files are `my.yaml`,
# `vocab.txt`: not checked).
EXTENSIONS = (".md", ".py", ".sh", ".cpp", ".hpp", ".cu", ".sbatch")
# Names of files that a run, a build or a user makes, not files of the repository.
MADE = re.compile(r"^(build[^/]*|bench-data|\.devbuild|\.venv|out|OUT|/tmp)(/|$)")


def check(root: pathlib.Path) -> list:
    git = ["git", "ls-files"]
    tracked = set(subprocess.run(git, capture_output=True, text=True, cwd=root,
                                 check=True).stdout.split())
    folders = {str(parent) for name in tracked for parent in pathlib.PurePosixPath(name).parents}
    basenames = {pathlib.PurePosixPath(name).name for name in tracked}

    def exists(path: str) -> bool:
        path = path.rstrip("/")
        return (path in tracked or path in folders or f"{path}.cpp" in tracked
                or f"{path}.hpp" in tracked)

    problems = []
    for doc in sorted(n for n in tracked if n.endswith(".md")):
        text = (root / doc).read_text()
        base = pathlib.PurePosixPath(doc).parent
        for m in LINK.finditer(text):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = os.path.normpath(str(base / target))
            if not exists(resolved):
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{doc}:{line}: the link {target} names no file of the repository")
        for m in QUOTED.finditer(text):
            quoted = m.group(1)
            if MADE.match(quoted) or "*" in quoted:
                continue
            line = text.count("\n", 0, m.start()) + 1
            if quoted.startswith(FOLDERS):
                # A built binary of a tool is named by its source.
                if not exists(quoted) and not exists(quoted + ".cpp"):
                    problems.append(f"{doc}:{line}: `{quoted}` names no file of the repository")
            elif "/" not in quoted and quoted.endswith(EXTENSIONS) and quoted not in basenames:
                problems.append(f"{doc}:{line}: `{quoted}` names no file of the repository")
    return problems


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = check(root)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
