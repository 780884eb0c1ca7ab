"""The plugin's settings: command-line options and ini keys, resolved once per session.

Each setting exists as ``--nobreak-x`` on the command line and ``nobreak_x`` in
``[tool.pytest.ini_options]``; the command line wins. Options default to ``None`` so "not
given" can be told apart from an explicit value.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from asic_backend.config import AsicConfig

DEFAULT_BACKEND = "inductor"
ASIC_BACKEND = "asic"


@dataclasses.dataclass(frozen=True)
class Option:
    flag: str
    ini: str | None
    kind: str  # "bool" | "string" | "path"
    help: str


OPTIONS = (
    Option(
        "--asic-backend",
        "nobreak_asic_backend",
        "bool",
        "compile the nobreak fixtures with the bundled ASIC simulator backend",
    ),
    Option(
        "--asic-device",
        "nobreak_asic_device",
        "string",
        "simulated device for --asic-backend: a preset (default, tpu_v1, gemmini) or a TOML "
        "file (default: $ASIC_BACKEND_CONFIG or 'default')",
    ),
    Option(
        "--asic-roofline",
        "nobreak_asic_roofline",
        "path",
        "write an SVG roofline of the simulated device(s), one point per benchmarked layer",
    ),
    Option(
        "--nobreak-backend",
        "nobreak_backend",
        "string",
        f"torch.compile backend of the nobreak_compile fixture (default: {DEFAULT_BACKEND})",
    ),
    Option(
        "--nobreak-all",
        "nobreak_all",
        "bool",
        "watch every test; breaks in unmarked tests are reported, not failed",
    ),
    Option(
        "--nobreak-json", "nobreak_json", "path", "write the compile report as JSON to this path"
    ),
    Option(
        "--nobreak-baseline",
        "nobreak_baseline",
        "path",
        "compare per-test compile figures with this baseline file; a figure that rises fails",
    ),
    Option(
        "--nobreak-update-baseline",
        None,
        "bool",
        "rewrite the baseline entries of the tests that ran (others are kept)",
    ),
    Option(
        "--nobreak-strict",
        "nobreak_strict",
        "bool",
        "a test missing from the baseline fails the run (default: on when $CI is set)",
    ),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("nobreak", "torch.compile graph-break checks (pytest-nobreak)")
    for opt in OPTIONS:
        dest = opt.flag.lstrip("-").replace("-", "_")
        if opt.kind == "bool":
            group.addoption(opt.flag, action="store_true", default=None, dest=dest, help=opt.help)
        else:
            group.addoption(
                opt.flag,
                default=None,
                dest=dest,
                metavar="PATH" if opt.kind == "path" else "NAME",
                help=opt.help,
            )
        if opt.flag == "--nobreak-strict":
            group.addoption(
                "--no-nobreak-strict",
                action="store_false",
                default=None,
                dest=dest,
                help="do not fail on tests missing from the baseline (overrides $CI)",
            )
        if opt.ini is not None:
            # default=None tells "unset" from an explicit false (strict defaults to $CI).
            if opt.kind == "bool":
                parser.addini(opt.ini, opt.help, type="bool", default=None)
            else:
                parser.addini(opt.ini, opt.help, type="string", default=None)


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
    json_path: Path | None = None
    baseline_path: Path | None = None
    update_baseline: bool = False
    strict: bool = False
    backend_explicit: bool = False
    roofline_path: Path | None = None

    def asic_config(self) -> AsicConfig:
        """The simulated device: ``--asic-device`` (preset or TOML), else ``$ASIC_BACKEND_CONFIG``.

        Raises ``ValueError``/``OSError`` for a bad spec. Imports no torch.
        """
        from asic_backend.config import AsicConfig

        spec = self.asic_device
        return AsicConfig.load(spec) if spec else AsicConfig.from_env()

    @property
    def fixture_backend(self) -> str:
        """The backend ``nobreak_compile`` uses: ``asic`` under ``--asic-backend``."""
        return ASIC_BACKEND if self.asic else self.backend

    @classmethod
    def from_pytest_config(cls, config: pytest.Config) -> NobreakConfig:
        def get(opt: Option) -> Any:
            value = config.getoption(opt.flag.lstrip("-").replace("-", "_"))
            if value is None and opt.ini is not None:
                value = config.getini(opt.ini)
                if value == "":
                    value = None
            return value

        values = {opt.flag: get(opt) for opt in OPTIONS}
        rootpath = config.rootpath

        def path(flag: str) -> Path | None:
            raw = values[flag]
            if raw is None:
                return None
            p = Path(raw)
            # Command-line paths are relative to the invocation directory, ini paths to the
            # rootdir, as pytest does for its own options.
            from_cli = config.getoption(flag.lstrip("-").replace("-", "_")) is not None
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
        asic = bool(values["--asic-backend"])
        if asic and backend is not None and backend != ASIC_BACKEND:
            raise pytest.UsageError(
                f"--asic-backend and --nobreak-backend {backend} contradict each other: "
                "pass only one of them."
            )
        return cls(
            backend=backend or DEFAULT_BACKEND,
            asic=asic,
            asic_device=values["--asic-device"],
            watch_all=bool(values["--nobreak-all"]),
            json_path=path("--nobreak-json"),
            baseline_path=baseline,
            update_baseline=update,
            strict=_env_is_ci(os.environ) if strict is None else bool(strict),
            backend_explicit=backend is not None,
            roofline_path=path("--asic-roofline"),
        )
