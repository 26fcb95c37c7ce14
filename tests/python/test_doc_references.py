"""Every file the Markdown documents cite exists (tools/scripts/check_doc_references.py): a doc
that names a script, test or page that is not there is a defect like a crash. The checker is
tested on a small repository where it must find each kind of problem."""

import subprocess
import sys
from pathlib import Path

from conftest import ROOT

CHECK = ROOT / "tools" / "scripts" / "check_doc_references.py"


def check(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), str(repo)], capture_output=True,
                          text=True, timeout=120)


def test_every_file_the_docs_cite_exists():
    result = check(ROOT)
    assert result.returncode == 0, result.stdout


def test_the_checker_finds_a_missing_link_path_and_page(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "run.py").write_text("")
    (tmp_path / "tools" / "pair.cpp").write_text("")
    (tmp_path / "docs" / "a.md").write_text(
        "See [b](b.md), [run](../tools/run.py), [gone](../tools/gone.py),\n"
        "`tools/run.py`, `tools/pair` (a .cpp/.hpp pair), `tools/missing.sh`,\n"
        "`my.yaml` and `vocab.txt` (a user's), `a.md`, `notes.md`.\n")
    (tmp_path / "docs" / "b.md").write_text("")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    result = check(tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "docs/a.md:1: the link ../tools/gone.py names no file of the repository",
        "docs/a.md:2: `tools/missing.sh` names no file of the repository",
        "docs/a.md:3: `notes.md` names no file of the repository",
    ], result.stdout
