"""docs/cli.md is the CLI's own help (tools/scripts/gen_cli_docs.py): a help text changed in
tools/cli/ without regenerating the page fails here, with the diff."""

import subprocess
import sys

from conftest import ROOT

GEN = ROOT / "tools" / "scripts" / "gen_cli_docs.py"


def test_docs_cli_md_is_the_help_the_binary_prints(binary):
    result = subprocess.run([sys.executable, str(GEN), "--binary", str(binary), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_shows_a_diff_when_the_page_differs(binary, tmp_path):
    page = tmp_path / "cli.md"
    subprocess.run([sys.executable, str(GEN), "--binary", str(binary), "--output", str(page)],
                   check=True, timeout=300)
    page.write_text(page.read_text().replace("## precompute run\n", "## precompute runs\n"))
    result = subprocess.run([sys.executable, str(GEN), "--binary", str(binary), "--output",
                             str(page), "--check"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "-## precompute runs" in result.stdout and "+## precompute run" in result.stdout
