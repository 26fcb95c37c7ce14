"""The README's exit-code table is the code's and the tests': every code a scheduler may see is
declared once in tools/cli/exit_codes.hpp, listed once in the README's table, and made to happen
by at least one end-to-end test below that asserts it. A code added, dropped or left untested
anywhere fails here."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent

# For each code, tests (file::function) that run the real CLI into it and assert that code.
EVIDENCE = {
    0: ["test_cli.py::test_exit_code_3_when_failures_exceed_the_limit"],
    1: ["test_output_integrity.py::test_verify_exit_codes_are_the_readmes",
        "test_verify.py::test_manifest_with_an_id_the_output_lacks"],
    2: ["test_output_integrity.py::test_verify_exit_codes_are_the_readmes",
        "test_cli.py::test_bad_config_exits_2_naming_the_key"],
    3: ["test_cli.py::test_exit_code_3_when_failures_exceed_the_limit",
        "test_honest_runs.py::test_an_encoder_that_fails_on_every_sample_fails_the_run"],
    65: ["test_honest_runs.py::test_a_misspelled_column_is_refused_naming_it_and_the_columns_there",
         "test_cli.py::test_invalid_manifest_exits_65_naming_both_lines"],
    69: ["test_output_integrity.py::test_a_lock_without_a_pid_names_no_process"],
    70: ["test_resume.py::test_a_run_that_dies_with_no_sample_to_blame_gives_up_with_70"],
    73: ["test_broken_promises.py::test_a_folder_of_other_files_is_refused_and_never_emptied",
         "test_cli.py::test_unwritable_output_exits_73_before_decoding"],
    74: ["test_output_integrity.py::test_verify_exit_codes_are_the_readmes"],
    75: ["test_resume.py::test_without_the_supervisor_a_stuck_decoder_exits_75_and_a_rerun_resumes"],
}


def readme_table() -> dict:
    """code -> meaning, from the table after "Exit codes (for schedulers):"."""
    text = (ROOT / "README.md").read_text()
    start = text.index("Exit codes (for schedulers):")
    rows = {}
    for line in text[start:].splitlines()[1:]:
        if not line.strip():
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0].isdigit():
            code = int(cells[0])
            assert code not in rows, f"README lists exit code {code} twice"
            rows[code] = cells[1]
    return rows


def declared_codes() -> dict:
    """name -> value of every kExit constant in tools/cli/exit_codes.hpp."""
    text = (ROOT / "tools/cli/exit_codes.hpp").read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"constexpr int (kExit\w+) = (\d+);", text)}


def test_the_readme_lists_exactly_the_declared_codes():
    declared = declared_codes()
    assert len(set(declared.values())) == len(declared), f"two names share a code: {declared}"
    table = readme_table()
    assert sorted(table) == sorted(declared.values()), (
        f"README's exit codes {sorted(table)} differ from exit_codes.hpp's {declared}")
    assert all(len(meaning) > 10 for meaning in table.values())


def function_source(file: str, name: str) -> str:
    path = TESTS / file
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(path.read_text(), node)
    raise AssertionError(f"{file} has no test {name}")


def constants(file: str) -> dict:
    """Module-level NAME = number (and NAME, NAME = n, m) assignments of a test file."""
    values = {}
    for node in ast.parse((TESTS / file).read_text()).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        names = target.elts if isinstance(target, ast.Tuple) else [target]
        nums = value.elts if isinstance(value, ast.Tuple) else [value]
        for n, v in zip(names, nums):
            if isinstance(n, ast.Name) and isinstance(v, ast.Constant) and isinstance(v.value, int):
                values[n.id] = v.value
    return values


def asserts_code(source: str, code: int, named: dict) -> bool:
    """Whether the test's body asserts `code`: expect=N, returncode == N, or a named constant."""
    spelled = [str(code)] + [name for name, value in named.items() if value == code]
    for s in spelled:
        if re.search(rf"expect\s*=\s*{s}\b|returncode\s*==\s*{s}\b|exit_code\"\]\s*==\s*{s}\b",
                     source):
            return True
    # Exit 0 is the default expectation of the run helpers.
    return code == 0 and re.search(r"\.run\(|run_precompute\(", source) is not None


def test_every_code_in_the_table_has_a_test_that_makes_it_happen():
    table = readme_table()
    assert sorted(EVIDENCE) == sorted(table), "a code of the README has no evidence listed here"
    for code, tests in EVIDENCE.items():
        for test in tests:
            file, name = test.split("::")
            source = function_source(file, name)
            assert asserts_code(source, code, constants(file)), (
                f"{test} is listed for exit {code} but does not assert it")
