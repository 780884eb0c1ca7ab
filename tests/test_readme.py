"""What the README and docs/*.md show as runnable runs, and prints what they say it prints.

Three kinds of marked blocks:

- ``<!-- readme-test: NAME -->`` marks a ```python block; the ```text block right after it is
  that code's output, verbatim. Each runs in a fresh interpreter from the repository root.
- ``<!-- readme-file: NAME -->`` marks a ```python block whose first line is ``# FILE``: a file
  of the example project NAME. ``<!-- readme-run: NAME [exit=N] [project=DIR] -->`` marks a
  ```console block: ``$ pytest ...`` (or ``$ python ...``) commands, each followed by the
  output it shows (none for a command whose output the page leaves out). The files are
  written as shown (first line included, so the line numbers are the reader's) to an empty
  directory, with ``project=DIR`` first the files of ``tests/readme_projects/DIR`` (what the
  page does not show: the suite a baseline or a merge came from) and its script ``NAME.sh``
  run there (the earlier runs and edits the page tells of, not shown); the commands then run
  in order, as a user would type them (all but the last must succeed, the last exits N,
  default 0; ``exit=N1,N2,...`` gives each command's status), and each shown output must be
  a contiguous slice of the real one: a ``...`` line stands for any lines, and durations may
  differ.
- ``<!-- readme-example: PATH -->`` marks a block that is the repository file PATH, verbatim.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import zygote
from tests.conftest import INNER_PLUGINS, inner_pythonpath
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
    r"<!-- readme-run: (?P<name>[\w-]+)(?: exit=(?P<exit>\d+(?:,\d+)*))?"
    r"(?: project=(?P<project>[\w-]+))? -->\n```console\n(?P<body>.*?)```",
    re.DOTALL,
)
#: The files of the pages' example projects that the pages do not show (see the docstring).
HIDDEN = ROOT / "tests" / "readme_projects"
_EXAMPLE = re.compile(
    r"<!-- readme-example: (?P<path>\S+) -->\n```\w*\n(?P<text>.*?)```", re.DOTALL
)


def _pairs() -> list[tuple[str, str, str]]:
    return [(m["name"], m["code"], m["out"]) for m in _PAIR.finditer(TEXT)]


@dataclasses.dataclass(frozen=True)
class Command:
    """One ``$`` line of a run's block, and the output the page shows under it."""

    argv: list[str]
    shown: list[str]


@dataclasses.dataclass(frozen=True)
class Project:
    """An example project of the pages: its files, its commands and their shown output."""

    name: str
    files: dict[str, str]
    commands: list[Command]
    #: Each command's exit status.
    exits: list[int]
    #: ``tests/readme_projects/DIR``: files the page does not show, and the project's setup.
    hidden: Path | None = None

    @property
    def shown(self) -> list[str]:
        """The last command's shown output."""
        return self.commands[-1].shown


def _commands(body: str) -> list[Command]:
    commands: list[Command] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append(Command(shlex.split(line[2:], comments=True), []))
        else:
            assert commands, f"output before the first command: {line!r}"
            commands[-1].shown.append(line)
    return commands


def _exits(given: str | None, commands: int) -> list[int]:
    codes = [int(code) for code in (given or "0").split(",")]
    if len(codes) == 1:
        return [0] * (commands - 1) + codes
    assert len(codes) == commands, f"exit={given} for {commands} commands"
    return codes


def _projects() -> list[Project]:
    files: dict[str, dict[str, str]] = {}
    for m in _FILE.finditer(TEXT):
        files.setdefault(m["name"], {})[m["path"]] = m["code"]
    projects = []
    for m in _RUN.finditer(TEXT):
        hidden = HIDDEN / m["project"] if m["project"] else None
        commands = _commands(m["body"])
        assert hidden is None or hidden.is_dir(), f"[{m['name']}]: no {hidden}"
        projects.append(
            Project(
                name=m["name"],
                files=files.pop(m["name"], {}),
                commands=commands,
                exits=_exits(m["exit"], len(commands)),
                hidden=hidden,
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
    assert sorted(projects) == [
        "ci-broken",
        "ci-json",
        "ci-missing",
        "ci-ratchet",
        "ci-regression",
        "ci-update",
        "ci-upgrade",
        "decode",
        "export",
        "merge-json",
        "merge-shards",
        "quickstart",
        "scope",
        "syncs",
    ]
    assert sorted(projects["export"].files) == ["encoder.py", "test_encoder.py"]
    assert sorted(projects["syncs"].files) == ["model.py", "test_model.py"]
    assert sorted(projects["quickstart"].files) == ["model.py", "test_model.py"]
    assert sorted(projects["decode"].files) == ["test_decode.py"]
    assert sorted(projects["scope"].files) == ["test_translator.py", "translator.py"]
    for project in projects.values():
        assert project.commands, project.name
        assert all(command.argv[0] in _PROGRAMS for command in project.commands), project.name
        # The block starts right at the commands: their output follows without a gap.
        assert project.shown, project.name
        assert project.shown[0].strip(), project.name


#: The markers under which a ```console block is a run some test makes and compares: the
#: projects here, the ``--nobreak-model`` runs (tests/plugin/test_model_spec.py).
_RUN_MARKERS = ("<!-- readme-run: ", "<!-- nobreak-model-run: ")


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_console_block_is_a_run_the_tests_compare(page: str) -> None:
    """A ```console block shows commands and their output: each is run, or it could drift.
    (Commands alone, with nothing to compare, are ```bash blocks.)"""
    lines = PAGES[page].splitlines()
    unchecked = [
        number + 1
        for number, line in enumerate(lines)
        if line == "```console" and not (number and lines[number - 1].startswith(_RUN_MARKERS))
    ]
    assert not unchecked, f"{page}: ```console blocks no test runs, at lines {unchecked}"


def unquoted_ratios(page: str) -> list[str]:
    """The ratios (``1.08x``) of ``page``'s prose that neither of the two ```text blocks above
    them shows (to the prose's decimals): figures quoted from a run the page does not show."""
    parts = re.split(r"(```text\n.*?```)", page, flags=re.DOTALL)
    blocks: list[list[float]] = []
    missing = []
    for part in parts:
        if part.startswith("```text"):
            blocks.append([float(x) for x in re.findall(r"(?<![\w.])\d+\.\d+", part)])
            continue
        cells = [cell for block in blocks[-2:] for cell in block]
        for ratio in re.findall(r"(?<![\w.])(\d+\.(\d+))x\b", part):
            value, decimals = float(ratio[0]), len(ratio[1])
            if not any(round(cell, decimals) == value for cell in cells):
                missing.append(f"{ratio[0]}x")
    return missing


def test_unquoted_ratios_are_found() -> None:
    page = "a\n```text\nx = 1.234\ny = 0.5\n```\nit takes 1.23x, 0.50x and 2.00x\n"
    assert unquoted_ratios(page) == ["2.00x"]
    assert unquoted_ratios("no block: 1.5x") == ["1.5x"]


def test_the_benchmark_prose_quotes_the_ratios_its_runs_show() -> None:
    assert unquoted_ratios(PAGES["docs/benchmarks.md"]) == []


@pytest.mark.parametrize(("name", "code", "expected"), _pairs(), ids=[p[0] for p in _pairs()])
def test_readme_example_prints_what_the_readme_shows(name: str, code: str, expected: str) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = zygote.run([sys.executable, "-c", _CHECKED, code], cwd=ROOT, env=env, timeout=300)
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
    """The user's shell: no settings of the outer test run, an 80-column terminal, no color,
    Python's own bytecode caching; and the suite's inner-run plugins, which print nothing: the
    MAC accounting check (tests/mac_check.py, logging to ``mac_log``) and tests/gc_freeze.py.

    A CI image may set ``PYTHONDONTWRITEBYTECODE``: then each of these runs would assertion-
    rewrite hypothesis's 73 modules anew (the user's plugins load here), 0.9 s a run."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTEST_", "GITHUB_"))
        and name not in ("CI", "COLUMNS", "PYTHONDONTWRITEBYTECODE")
    }
    check = {"PYTEST_ADDOPTS": INNER_PLUGINS, "PYTHONPATH": inner_pythonpath()}
    if mac_log is not None:
        check[LOG] = str(mac_log)
    return {**env, **check, "COLUMNS": "80", "PY_COLORS": "0"}


def _pytest() -> list[str]:
    script = shutil.which("pytest", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "pytest"]


_JSON = re.compile(
    r"<!-- readme-json: (?P<name>[\w-]+) project=(?P<project>[\w-]+) file=(?P<file>\S+) -->\n"
    r"```json\n(?P<text>.*?)```",
    re.DOTALL,
)


def _json_samples() -> list[re.Match[str]]:
    return list(_JSON.finditer(TEXT))


def test_the_pages_json_samples_are_found() -> None:
    assert [m["name"] for m in _json_samples()] == ["ci-record"]


@pytest.mark.parametrize("sample", _json_samples(), ids=lambda m: m["name"])
def test_a_json_sample_is_the_file_a_real_run_writes(
    sample: re.Match[str], tmp_path: Path, recordings: Recordings
) -> None:
    """``<!-- readme-json: NAME project=DIR file=PATH -->`` marks a ```json block: the file
    PATH as ``tests/readme_projects/DIR/NAME.sh`` leaves it, its ``tests`` cut to some."""
    hidden = HIDDEN / sample["project"]
    _set_up(hidden, hidden / f"{sample['name']}.sh", tmp_path, _environment(), recordings)
    written = json.loads((tmp_path / sample["file"]).read_text(encoding="utf-8"))
    shown = json.loads(sample["text"])
    assert shown["tests"], "the sample shows no test"
    written["tests"] = {name: written["tests"].get(name) for name in shown["tests"]}
    assert shown == written
    # As the file is written: sorted, two-space indented.
    assert sample["text"] == json.dumps(shown, indent=2, sort_keys=True) + "\n"


#: What a page's ``$`` line may start with, and what runs it here.
_PROGRAMS = {"pytest": _pytest, "python": lambda: [sys.executable]}


@pytest.mark.parametrize("project", _projects(), ids=lambda p: p.name)
def test_readme_run_prints_what_the_readme_shows(
    project: Project, tmp_path: Path, recordings: Recordings
) -> None:
    mac_log = tmp_path.parent / f"{tmp_path.name}.macs"
    env = _environment(mac_log)
    if project.hidden is not None:
        _set_up(project.hidden, project.hidden / f"{project.name}.sh", tmp_path, env, recordings)
        mac_log.unlink(missing_ok=True)  # the shown commands' checks are counted below
    for path, text in project.files.items():
        (tmp_path / path).write_text(text, encoding="utf-8")
    for number, command in enumerate(project.commands, start=1):
        argv = [*_PROGRAMS[command.argv[0]](), *command.argv[1:]]
        proc = zygote.run(argv, cwd=tmp_path, env=env, timeout=600)
        expected = project.exits[number - 1]
        typed = f"$ {shlex.join(command.argv)}"
        assert proc.returncode == expected, f"{typed}\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
        output = (proc.stdout + proc.stderr).splitlines()
        if command.shown and not shown_slice(command.shown, output):
            # From the shown block's first line on, when the run printed it: the header is noise.
            start = next((i for i, line in enumerate(output) if line == command.shown[0]), 0)
            real = output[start:]
            diff = difflib.unified_diff(command.shown, real, "page", "real run", lineterm="")
            message = f"the pages' [{project.name}] example drifted at {typed}:\n"
            pytest.fail(message + "\n".join(diff), pytrace=False)
    # The accounting check ran in each pytest command that got past its usage checks (exit
    # status 4), and found nothing, or the run had failed.
    runs = sum(
        command.argv[0] == "pytest" and code != pytest.ExitCode.USAGE_ERROR
        for command, code in zip(project.commands, project.exits, strict=True)
    )
    assert len(mac_log.read_text().splitlines() if runs else []) >= runs


def _scripts(directory: str, names: list[str]) -> list[str]:
    return [name for name in names if name.endswith(".sh")]


#: The first step of most of the ci project's scripts: the suite's baseline recorded.
RECORD = "pytest -q --nobreak-update-baseline"


@dataclasses.dataclass
class Recordings:
    """Each project's directory after :data:`RECORD`, made once per module: seven scripts start
    with that run, and each pytest process costs 4 s."""

    root: Path
    done: dict[Path, Path] = dataclasses.field(default_factory=dict)

    def of(self, hidden: Path, env: dict[str, str]) -> Path:
        if hidden not in self.done:
            directory = self.root / hidden.name
            shutil.copytree(hidden, directory, ignore=_scripts)
            _run_script(RECORD, directory, env, f"{hidden.name}: {RECORD}")
            self.done[hidden] = directory
        return self.done[hidden]


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    return Recordings(tmp_path_factory.mktemp("recorded"))


def _set_up(
    hidden: Path, script: Path, cwd: Path, env: dict[str, str], recordings: Recordings
) -> None:
    """``hidden``'s files in ``cwd``, and its ``script`` run there when it has one (the earlier
    runs and edits the page tells of). A script that starts with :data:`RECORD` starts from a
    copy of the directory that run leaves: the same files, bytecode caches aside (they name the
    directory they were compiled in)."""
    steps = script.read_text(encoding="utf-8").splitlines() if script.exists() else []
    first = next((i for i, line in enumerate(steps) if line and not line.startswith("#")), None)
    if first is not None and steps[first] == RECORD:
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(recordings.of(hidden, env), cwd, dirs_exist_ok=True, ignore=ignore)
        steps = steps[first + 1 :]
    else:
        shutil.copytree(hidden, cwd, dirs_exist_ok=True, ignore=_scripts)
    if steps:
        _run_script("\n".join(steps), cwd, env, script.name)


def _run_script(script: str, cwd: Path, env: dict[str, str], name: str) -> None:
    # `pytest` and `python` there are this environment's, as in the shown commands.
    path = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env={**env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"


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
