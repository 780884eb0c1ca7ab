"""What the README and docs/*.md show as runnable runs, and prints what they say it prints.

Three kinds of marked blocks:

- ``<!-- readme-test: NAME -->`` marks a ```python block; the ```text block right after it is
  that code's output, verbatim. Each runs in a fresh interpreter from the repository root.
- ``<!-- readme-file: NAME -->`` marks a ```python block whose first line is ``# FILE``: a file
  of the example project NAME. ``<!-- readme-run: NAME [exit=N] -->`` marks a ```console block:
  ``$ pytest ...`` commands, then the output of the last one. The files are written as shown
  (first line included, so the line numbers are the reader's) to an empty directory, the
  commands run there in order, as a user would type them (all but the last must succeed, the
  last exits N, default 0), and the shown output must be a contiguous slice of the real one:
  a ``...`` line stands for any lines, and durations may differ.
- ``<!-- readme-example: PATH -->`` marks a block that is the repository file PATH, verbatim.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MAC_CHECK, inner_pythonpath
from tests.mac_check import LOG

if sys.version_info >= (3, 11):
    import tomllib
else:  # the backport asic_backend depends on there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: Every page a user reads: the README and the reference pages it links to (``docs/zoo.md`` is
#: generated, and checked by tests/plugin/test_zoo.py).
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if path.name != "zoo.md"
}
#: All of them, for the marked blocks (whose names are unique across pages).
TEXT = "\n\n".join(PAGES.values())

_PAIR = re.compile(
    r"<!-- readme-test: (?P<name>[\w-]+) -->\n```python\n(?P<code>.*?)```\n\n```text\n"
    r"(?P<out>.*?)```",
    re.DOTALL,
)
_FILE = re.compile(
    r"<!-- readme-file: (?P<name>[\w-]+) -->\n```python\n(?P<code># (?P<path>\S+)\n.*?)```",
    re.DOTALL,
)
_RUN = re.compile(
    r"<!-- readme-run: (?P<name>[\w-]+)(?: exit=(?P<exit>\d+))? -->\n```console\n(?P<body>.*?)```",
    re.DOTALL,
)
_EXAMPLE = re.compile(
    r"<!-- readme-example: (?P<path>\S+) -->\n```\w*\n(?P<text>.*?)```", re.DOTALL
)


def _pairs() -> list[tuple[str, str, str]]:
    return [(m["name"], m["code"], m["out"]) for m in _PAIR.finditer(TEXT)]


@dataclasses.dataclass(frozen=True)
class Project:
    """An example project of the README: its files, its commands and the last one's output."""

    name: str
    files: dict[str, str]
    commands: list[list[str]]
    shown: list[str]
    exit: int


def _projects() -> list[Project]:
    files: dict[str, dict[str, str]] = {}
    for m in _FILE.finditer(TEXT):
        files.setdefault(m["name"], {})[m["path"]] = m["code"]
    projects = []
    for m in _RUN.finditer(TEXT):
        lines = m["body"].splitlines()
        commands = [shlex.split(line[2:], comments=True) for line in lines if line[:2] == "$ "]
        projects.append(
            Project(
                name=m["name"],
                files=files.pop(m["name"], {}),
                commands=commands,
                shown=lines[len(commands) :],
                exit=int(m["exit"] or 0),
            )
        )
    assert not files, f"readme-file blocks without a readme-run block: {sorted(files)}"
    return projects


def test_the_readme_has_runnable_examples() -> None:
    assert sorted(name for name, _, _ in _pairs()) == [
        "host-fallbacks",
        "host-fusion",
        "weight-buffers",
    ]
    projects = {p.name: p for p in _projects()}
    assert sorted(projects) == ["decode", "export", "quickstart", "scope", "syncs"]
    assert sorted(projects["export"].files) == ["encoder.py", "test_encoder.py"]
    assert sorted(projects["syncs"].files) == ["model.py", "test_model.py"]
    assert sorted(projects["quickstart"].files) == ["model.py", "test_model.py"]
    assert sorted(projects["decode"].files) == ["test_decode.py"]
    assert sorted(projects["scope"].files) == ["test_translator.py", "translator.py"]
    for project in projects.values():
        assert project.commands, project.name
        assert all(command[0] == "pytest" for command in project.commands), project.name
        # The block starts right at the commands: their output follows without a gap.
        assert project.shown, project.name
        assert project.shown[0].strip(), project.name


@pytest.mark.parametrize(("name", "code", "expected"), _pairs(), ids=[p[0] for p in _pairs()])
def test_readme_example_prints_what_the_readme_shows(name: str, code: str, expected: str) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHECKED, code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == expected
    assert re.search(r"^mac check: graphs=\d+ calls=\d+$", proc.stderr, flags=re.MULTILINE)


#: Runs a README snippet (``sys.argv[1]``) as ``python -c`` would, under the suite's MAC
#: accounting check (tests/accounting.py), and says on stderr what it checked.
_CHECKED = """
import sys
from tests.accounting import checking_every_graph
with checking_every_graph() as checked:
    exec(compile(sys.argv[1], "<string>", "exec"), {"__name__": "__main__"})
print(f"mac check: graphs={checked.graphs} calls={checked.calls}", file=sys.stderr)
"""


# Separator lines take the terminal's width whatever their text, and the last one names the
# duration: neither is the README's business.
_DURATION = re.compile(r" in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?")
_SEPARATOR = re.compile(r"^([=_-])\1+ (.*) \1+$")


def normalized(line: str) -> str:
    line = _DURATION.sub(" in <duration>", line.rstrip())
    return _SEPARATOR.sub(r"\1 \2 \1", line)


def shown_slice(shown: list[str], output: list[str]) -> bool:
    """Whether ``shown`` is a contiguous slice of ``output``, ``...`` standing for any lines."""
    pattern = "".join(
        r"(?:.*\n)*?" if line == "..." else re.escape(normalized(line)) + r"\n" for line in shown
    )
    text = "".join(normalized(line) + "\n" for line in output)
    return re.search("(?m)^" + pattern, text) is not None


def test_shown_slice_matches_lines_in_order_with_gaps() -> None:
    output = ["header", "a", "b", "c", "===== 1 passed in 8.52s ====="]
    assert shown_slice(["a", "b"], output)
    assert shown_slice(["a", "...", "c", "== 1 passed in 1.0s =="], output)
    assert not shown_slice(["a", "c"], output)  # a gap needs its "..."
    assert not shown_slice(["b", "a"], output)
    assert not shown_slice(["eader"], output)  # whole lines only
    assert not shown_slice(["== 2 passed in 1.0s =="], output)


def _environment(mac_log: Path | None = None) -> dict[str, str]:
    """The user's shell: no settings of the outer test run, an 80-column terminal, no color;
    and the suite's MAC accounting check (tests/mac_check.py), which prints nothing, logging
    to ``mac_log``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "GITHUB_")) and name not in ("CI", "COLUMNS")
    }
    check = {"PYTEST_ADDOPTS": MAC_CHECK, "PYTHONPATH": inner_pythonpath()}
    if mac_log is not None:
        check[LOG] = str(mac_log)
    return {**env, **check, "COLUMNS": "80", "PY_COLORS": "0"}


def _pytest() -> list[str]:
    script = shutil.which("pytest", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "pytest"]


@pytest.mark.parametrize("project", _projects(), ids=lambda p: p.name)
def test_readme_run_prints_what_the_readme_shows(project: Project, tmp_path: Path) -> None:
    for path, text in project.files.items():
        (tmp_path / path).write_text(text, encoding="utf-8")
    mac_log = tmp_path.parent / f"{tmp_path.name}.macs"
    for number, command in enumerate(project.commands, start=1):
        proc = subprocess.run(
            [*_pytest(), *command[1:]],
            cwd=tmp_path,
            env=_environment(mac_log),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        expected = project.exit if number == len(project.commands) else 0
        assert proc.returncode == expected, f"$ {shlex.join(command)}\n{proc.stdout[-3000:]}"
    output = proc.stdout.splitlines()
    if not shown_slice(project.shown, output):
        # From the shown block's first line on, when the run printed it: the header is noise.
        start = next((i for i, line in enumerate(output) if line == project.shown[0]), 0)
        real = output[start:]
        diff = difflib.unified_diff(project.shown, real, "README", "real run", lineterm="")
        message = f"the pages' [{project.name}] example drifted:\n" + "\n".join(diff)
        pytest.fail(message, pytrace=False)
    # The accounting check ran in each command (and found nothing, or the run had failed).
    assert len(mac_log.read_text().splitlines()) >= len(project.commands)


def test_readme_example_files_are_the_repository_files() -> None:
    examples = {m["path"]: m["text"] for m in _EXAMPLE.finditer(TEXT)}
    assert sorted(examples) == ["examples/lab_device.toml"]
    for path, text in examples.items():
        assert (ROOT / path).read_text(encoding="utf-8") == text, path


def test_the_device_toml_format_is_documented_and_the_example_loads() -> None:
    """Every field of ``AsicConfig`` has a row in the README's table, and the example file sets
    each of them (so it shows the whole format) to what the README says it prints."""
    from asic_backend.sim.config import AsicConfig

    fields = [field.name for field in dataclasses.fields(AsicConfig)]
    section = PAGES["docs/device.md"]
    rows = re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", section, flags=re.MULTILINE)
    documented = {name for row in rows for name in row if name}
    assert documented == {"preset", *fields}

    path = ROOT / "examples" / "lab_device.toml"
    assert set(tomllib.loads(path.read_text())) == {"preset", *fields}
    config = AsicConfig.from_toml(path)
    assert config.describe() == "lab64 (64x64 os @ 0.8 GHz)"
    assert f"device={config.describe()}, watching marked tests" in section
    assert f"`device` is `{config.key}`" in " ".join(section.split())


def test_the_options_table_lists_every_option_and_its_ini_key() -> None:
    from pytest_nobreak.config import OPTIONS

    section = README.split("## Command line and ini", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(
        r"^\| `(--[\w-]+)[^`]*`(?: / `(--[\w-]+)`)? \| (?:`(\w+)`)? *\|", section, re.M
    )
    table = {flag: ini for flag, _, ini in rows}
    assert table == {opt.flag: opt.ini or "" for opt in OPTIONS}
    assert [negated for _, negated, _ in rows if negated] == ["--no-nobreak-strict"]
    for opt in OPTIONS:  # the rule the section states
        assert opt.ini in (None, opt.flag.removeprefix("--").replace("-", "_"))
        for old in opt.old_ini:
            assert f"`{old}`" in section


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings (code blocks' ``#`` lines are no headings)."""
    out, inside = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_link_of_a_page_resolves(page: str) -> None:
    """The README's reference parts live in docs/: each link between them (and to the
    repository's files) names a file that exists and, with a ``#``, one of its headings."""
    broken = []
    base = (ROOT / page).parent
    for target in _LINK.findall(PAGES[page]):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else ROOT / page
        headed = file.suffix != ".md" or not anchor or not file.exists()
        if not file.exists() or not (headed or anchor in _anchors(file.read_text("utf-8"))):
            broken.append(target)
    assert broken == []
