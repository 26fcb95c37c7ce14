"""The `Note [Title]` convention holds over the repository (tools/scripts/check_notes.py): every
reference names a Note that is defined, once, and in the file the reference names, if it names
one. The checker itself is tested on a small repository where it must find each kind of problem."""

import subprocess
import sys
from pathlib import Path

from conftest import ROOT

CHECK = ROOT / "tools" / "scripts" / "check_notes.py"


def check(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), str(repo)], capture_output=True,
                          text=True, timeout=120)


def test_every_note_reference_in_the_repository_resolves_to_one_definition():
    result = check(ROOT)
    assert result.returncode == 0, result.stdout


def test_the_checker_finds_a_missing_and_a_doubled_definition(tmp_path):
    (tmp_path / "a.cpp").write_text(
        "// Note [Defined once]\n// Why it is so.\nint a;\n"
        "int b;  // (Note [Defined once]), then Note [Never\n// defined] across a line break\n"
        "// Note [Twice]\n// first\n")
    (tmp_path / "b.py").write_text('"""A module.\n\nNote [Short one]: a docstring Note.\n"""\n'
                                   "# Note [Twice]\n# again\nx = 1  # Note [Short one]\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    result = check(tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines == ["a.cpp:4: Note [Never defined] is referenced but defined nowhere",
                     "b.py:5: Note [Twice] is defined again (first at a.cpp:6)"], lines


def test_the_checker_finds_a_reference_that_names_the_wrong_file(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.cpp").write_text("// Note [Here]\n// Why.\nint a;\n")
    (tmp_path / "b.hpp").write_text(
        "// Right (Note [Here] in src/a.cpp), right (Note [Here] in a.cpp), right (Note [Here]\n"
        "// there), wrong (Note [Here] in\n// src/b.cpp).\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    result = check(tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "b.hpp:2: Note [Here] is said to be in src/b.cpp, but is defined at src/a.cpp:1"], \
        result.stdout
