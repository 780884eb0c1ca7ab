"""The plugin's settings: command-line options and ini keys, resolved once per session.

Each setting exists as ``--x-y`` on the command line and ``x_y`` in
``[tool.pytest.ini_options]`` (``--asic-backend`` / ``asic_backend``); the command line wins.
Options default to ``None`` so "not given" can be told apart from an explicit value.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from asic_backend.sim.config import PRESETS, AsicConfig
from pytest_nobreak.watch.events import SCOPES, Scope

if TYPE_CHECKING:
    from asic_backend.sim.config import AsicConfig

DEFAULT_BACKEND = "inductor"
ASIC_BACKEND = "asic"
#: ``--nobreak-unmarked``: breaks in unmarked tests are reported, or also fail the run.
UNMARKED_CHOICES = ("report", "fail")


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting: a command-line flag and, unless ``cli_only``, an ini key of the same name.

    The ini key is the flag without ``--`` and with ``_`` for ``-`` (``--asic-backend`` is
    ``asic_backend``): one rule, with no per-option exceptions for users to look up.
    """

    flag: str
    kind: str  # "bool" | "string" | "path" | "choice" | "lines"
    help: str
    #: The values a "choice" takes; anything else is a usage error, on the command line and in
    #: the ini file alike.
    choices: tuple[str, ...] = ()
    #: A one-off action that must not be switched on for good by an ini file.
    cli_only: bool = False
    #: Earlier spellings of the ini key, still read (``nobreak_asic_backend``).
    old_ini: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """The attribute name in pytest's option namespace."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def ini(self) -> str | None:
        return None if self.cli_only else self.dest


OPTIONS = (
    Option(
        "--asic-backend",
        "bool",
        "compile the nobreak fixtures with the bundled ASIC simulator backend",
        old_ini=("nobreak_asic_backend",),
    ),
    Option(
        "--asic-device",
        "string",
        "simulated device (implies --asic-backend): a preset (default, tpu_v1, gemmini) or a "
        "TOML file (default: $ASIC_BACKEND_CONFIG or 'default')",
        old_ini=("nobreak_asic_device",),
    ),
    Option(
        "--asic-roofline",
        "path",
        "write an SVG roofline of the simulated device(s), one point per benchmarked layer",
        old_ini=("nobreak_asic_roofline",),
    ),
    Option(
        "--nobreak-backend",
        "string",
        f"torch.compile backend of the nobreak_compile fixture (default: {DEFAULT_BACKEND})",
    ),
    Option(
        "--nobreak-all",
        "bool",
        "watch every test; unmarked tests are only observed and their breaks reported",
    ),
    Option(
        "--nobreak-unmarked",
        "choice",
        "what breaks in unmarked tests do: 'report' (default) or 'fail' the run (their outcomes "
        "stay theirs); 'fail' implies --nobreak-all",
        choices=UNMARKED_CHOICES,
    ),
    Option(
        "--nobreak-scope",
        "choice",
        "which problems fail a test: 'all' (default) or 'own', those in your code only (a "
        "library's are reported, not failed); a marker's scope= wins",
        choices=SCOPES,
    ),
    Option(
        "--nobreak-first-party",
        "lines",
        "a top-level package that is your code although installed (repeatable; in the ini "
        "file, one a line)",
    ),
    Option(
        "--nobreak-json",
        "path",
        "write this run's compile report as JSON to this path (replacing the file)",
    ),
    Option(
        "--nobreak-html",
        "path",
        "write this run's compile report as one self-contained HTML page to this path",
    ),
    Option(
        "--nobreak-baseline",
        "path",
        "compare per-test compile figures with this baseline file; a figure that rises fails",
    ),
    Option(
        "--nobreak-update-baseline",
        "bool",
        "rewrite the baseline entries of the tests that ran (others are kept)",
        cli_only=True,
    ),
    Option(
        "--nobreak-strict",
        "bool",
        "a test missing from the baseline fails the run (default: on when $CI is set)",
    ),
)

#: Prefixes of the ini keys this plugin reads: an unknown key with one of them is a typo of ours.
_INI_PREFIXES = ("nobreak_", "asic_")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("nobreak", "torch.compile graph-break checks (pytest-nobreak)")
    for opt in OPTIONS:
        if opt.kind == "bool":
            group.addoption(
                opt.flag, action="store_true", default=None, dest=opt.dest, help=opt.help
            )
        elif opt.kind == "choice":
            group.addoption(
                opt.flag, default=None, dest=opt.dest, choices=opt.choices, help=opt.help
            )
        elif opt.kind == "lines":
            group.addoption(
                opt.flag,
                action="append",
                default=None,
                dest=opt.dest,
                metavar="NAME",
                help=opt.help,
            )
        else:
            group.addoption(
                opt.flag,
                default=None,
                dest=opt.dest,
                metavar="PATH" if opt.kind == "path" else "NAME",
                help=opt.help,
            )
        if opt.flag == "--nobreak-strict":
            group.addoption(
                "--no-nobreak-strict",
                action="store_false",
                default=None,
                dest=opt.dest,
                help="do not fail on tests missing from the baseline (overrides $CI)",
            )
        for key in (opt.ini, *opt.old_ini) if opt.ini else ():
            help = opt.help if key == opt.ini else f"older spelling of {opt.ini}"
            # default=None tells "unset" from an explicit false (strict defaults to $CI).
            if opt.kind == "bool":
                parser.addini(key, help, type="bool", default=None)
            elif opt.kind == "lines":
                parser.addini(key, help, type="linelist", default=[])
            else:
                parser.addini(key, help, type="string", default=None)


def check_ini_keys(config: pytest.Config) -> None:
    """Stop on an ini key that looks like ours but is not one (exit 4, one line per key).

    pytest only warns about an unknown key, and the run then quietly uses the default (the
    tests compile with inductor instead of the ASIC): easy to miss in a long log.
    """
    # pytest's own "Unknown config option" check; it has no public API for the list.
    unknown_keys = getattr(config, "_get_unknown_ini_keys", None)
    if unknown_keys is None:
        return
    keys = [opt.ini for opt in OPTIONS if opt.ini]
    cli_only = {opt.dest: opt.flag for opt in OPTIONS if opt.cli_only}
    problems = []
    for key in sorted(unknown_keys()):
        if not key.startswith(_INI_PREFIXES):
            continue
        if key in cli_only:
            problems.append(
                f"ini key {key}: {cli_only[key]} is a command-line action only, so that no ini "
                "file leaves every run doing it"
            )
            continue
        close = difflib.get_close_matches(key, keys, n=1)
        suggestion = f" (did you mean {close[0]}?)" if close else ""
        problems.append(
            f"ini key {key} is not a pytest-nobreak setting{suggestion}; "
            f"known keys: {', '.join(keys)}"
        )
    if problems:
        raise pytest.UsageError(*problems)


def _env_is_ci(env: os._Environ[str] | dict[str, str]) -> bool:
    value = env.get("CI", "").strip().lower()
    return value not in ("", "0", "false", "no")


@dataclasses.dataclass(frozen=True)
class NobreakConfig:
    """Resolved settings of one pytest session (see ``OPTIONS`` for their meaning)."""

    backend: str = DEFAULT_BACKEND
    asic: bool = False
    asic_device: str | None = None
    watch_all: bool = False
    #: Breaks in unmarked tests fail the run (``--nobreak-unmarked fail``).
    fail_unmarked: bool = False
    json_path: Path | None = None
    html_path: Path | None = None
    baseline_path: Path | None = None
    update_baseline: bool = False
    strict: bool = False
    backend_explicit: bool = False
    roofline_path: Path | None = None
    #: Which problems fail a test (``--nobreak-scope``); a marker's ``scope=`` wins.
    scope: Scope = "all"
    #: Installed top-level packages that are the user's code (``nobreak_first_party``).
    first_party: tuple[str, ...] = ()

    def asic_config(self) -> AsicConfig:
        """The simulated device: ``--asic-device`` (preset or TOML), else ``$ASIC_BACKEND_CONFIG``.

        Raises ``ValueError``/``OSError`` for a bad spec. Imports no torch.
        """

        spec = self.asic_device
        return AsicConfig.load(spec) if spec else AsicConfig.from_env()

    @property
    def fixture_backend(self) -> str:
        """The backend ``nobreak_compile`` uses: ``asic`` under ``--asic-backend``."""
        return ASIC_BACKEND if self.asic else self.backend

    @property
    def host_syncs_fail(self) -> bool:
        """Whether a host sync fails a test unless its marker says otherwise: on the simulated
        ASIC, which cannot run one (each stops the device, as in the seed); not elsewhere."""
        return self.fixture_backend == ASIC_BACKEND

    @classmethod
    def from_pytest_config(cls, config: pytest.Config) -> NobreakConfig:
        values = {opt.flag: _value(config, opt) for opt in OPTIONS}
        rootpath = config.rootpath

        def path(flag: str) -> Path | None:
            raw = values[flag]
            if raw is None:
                return None
            p = Path(raw)
            # Command-line paths are relative to the invocation directory, ini paths to the
            # rootdir, as pytest does for its own options.
            from_cli = config.getoption(_OPTION[flag].dest) is not None
            return p if p.is_absolute() or from_cli else rootpath / p

        backend = values["--nobreak-backend"]
        strict = values["--nobreak-strict"]
        update = bool(values["--nobreak-update-baseline"])
        baseline = path("--nobreak-baseline")
        if update and baseline is None:
            raise pytest.UsageError(
                "--nobreak-update-baseline needs a baseline file: pass --nobreak-baseline PATH "
                "or set nobreak_baseline in the ini file."
            )
        device = values["--asic-device"]
        if device is not None and config.getoption("asic_device") is None:
            device = _ini_device(device, rootpath)
        # Naming a simulated device asks for the simulator: running the fixtures on inductor
        # while a device is named would ignore it without a word.
        asic = bool(values["--asic-backend"]) or device is not None
        if asic and backend is not None and backend != ASIC_BACKEND:
            why = (
                "--asic-backend"
                if values["--asic-backend"]
                else f"--asic-device {device} (which implies --asic-backend)"
            )
            raise pytest.UsageError(
                f"{why} and --nobreak-backend {backend} contradict each other: "
                "pass only one of them."
            )
        # Failing on unmarked tests' breaks asks for unmarked tests to be watched.
        fail_unmarked = _choice(config, _OPTION["--nobreak-unmarked"], values) == "fail"
        return cls(
            backend=backend or DEFAULT_BACKEND,
            asic=asic,
            asic_device=device,
            watch_all=bool(values["--nobreak-all"]) or fail_unmarked,
            fail_unmarked=fail_unmarked,
            json_path=path("--nobreak-json"),
            html_path=path("--nobreak-html"),
            baseline_path=baseline,
            update_baseline=update,
            strict=_env_is_ci(os.environ) if strict is None else bool(strict),
            backend_explicit=backend is not None,
            roofline_path=path("--asic-roofline"),
            scope=_choice(config, _OPTION["--nobreak-scope"], values),  # type: ignore[arg-type]
            first_party=_first_party(values["--nobreak-first-party"] or ()),
        )


_OPTION = {opt.flag: opt for opt in OPTIONS}


def _ini_device(spec: str, rootpath: Path) -> str:
    """An ini ``asic_device`` file is relative to the rootdir, as every ini path; a preset is a
    name, not a path."""

    if spec in PRESETS or Path(spec).is_absolute():
        return spec
    return str(rootpath / spec)


def _choice(config: pytest.Config, opt: Option, values: dict[str, Any]) -> str:
    """The value of a "choice" option, its first choice when unset. argparse checks the command
    line; an ini value is checked here, so a typo is not quietly the default."""
    value = values[opt.flag]
    if value is None:
        return opt.choices[0]
    if value not in opt.choices:
        close = difflib.get_close_matches(str(value), opt.choices, n=1)
        suggestion = f" (did you mean {close[0]}?)" if close else ""
        raise pytest.UsageError(
            f"ini key {opt.ini}: {value!r} is not one of {', '.join(opt.choices)}{suggestion}"
        )
    return str(value)


def _first_party(names: Any) -> tuple[str, ...]:
    """The ``nobreak_first_party`` packages, each checked: a name that is not an importable
    top-level package would quietly leave that code a library's, and its breaks unfailed."""
    out: list[str] = []
    for raw in names:
        name = str(raw).strip()
        if not name or name.startswith("#"):
            continue
        if not name.isidentifier():
            hint = f" (the top-level package is {name.split('.')[0]!r})" if "." in name else ""
            raise pytest.UsageError(
                f"nobreak_first_party: {name!r} is not a top-level package name{hint}"
            )
        if name in sys.stdlib_module_names:
            raise pytest.UsageError(
                f"nobreak_first_party: {name!r} is the standard library's, not a package of yours"
            )
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise pytest.UsageError(
                f"nobreak_first_party: no package {name!r} can be imported by {sys.executable}; "
                "install it (pip install -e .) or fix the name"
            )
        if name not in out:
            out.append(name)
    return tuple(out)


def _value(config: pytest.Config, opt: Option) -> Any:
    """The option's value: the command line, else its ini key (or an older spelling of it).

    ``None`` when unset; an empty ini value (``-o nobreak_json=``) is unset too.
    """
    value = config.getoption(opt.dest)
    if value is not None or opt.ini is None:
        return value
    found = {}
    for key in (opt.ini, *opt.old_ini):
        raw = config.getini(key)
        if raw is not None and raw != "":
            found[key] = raw
    if len(found) > 1:
        raise pytest.UsageError(
            f"ini keys {' and '.join(found)} are the same setting ({opt.flag}): keep only {opt.ini}"
        )
    return next(iter(found.values()), None)
