"""``python -m pytest_nobreak zoo REPORT OUTPUT``: the model-zoo table from a JSON report.

The committed ``docs/zoo.md`` must be exactly what the command writes from the committed sweep
report ``docs/zoo.json``; a small real run checks each kind of row (whole and on the DUT,
broken, host ops left, not built).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_nobreak.report.zoo import main, render_zoo
from tests.plugin.test_model_spec import FACTORIES, QUIET

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_zoo_is_what_the_command_writes() -> None:
    report = json.loads((ROOT / "docs" / "zoo.json").read_text(encoding="utf-8"))
    written = (ROOT / "docs" / "zoo.md").read_text(encoding="utf-8")
    assert written == render_zoo(report), (
        "docs/zoo.md is not what `python -m pytest_nobreak zoo docs/zoo.json docs/zoo.md` writes"
    )


def test_the_table_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    """Counts that tie are ranked by name: the problems of a row are a set, whose order follows
    ``PYTHONHASHSEED``, and a CI machine's seed differs from the one the page was written with."""
    pages = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"zoo-{seed}.md"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest_nobreak",
                "zoo",
                str(ROOT / "docs" / "zoo.json"),
                str(out),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        pages.append(out.read_text(encoding="utf-8"))
    assert pages[0] == pages[1] == pages[2]


def test_the_models_page_states_the_zoo_counts() -> None:
    """The page's figures are the generated table's headline, in its order; the rest of the
    breakdown is on the generated page only (no hand-copied count can go stale)."""
    zoo = (ROOT / "docs" / "zoo.md").read_text(encoding="utf-8")
    models = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    section = models[models.index("## The model zoo") :]
    section = section[: section.find("\n## ", 1)]
    headline = zoo[: zoo.index("| model |")].split("Of the ")[0]
    assert re.findall(r"\*\*(\d+)\*\*", section) == re.findall(r"\*\*(\d+)\*\*", headline)
    # A count in the prose would be a hand copy: beside the headline, only units, versions,
    # percentages and gb ids (which the lookarounds leave out) are numbers there.
    prose = re.sub(r"```.*?```|`[^`]*`", "", section, flags=re.DOTALL)
    numbers = re.findall(r"(?<![\w.-])\d+(?![\w.%]| s\b| min\b| cores)", prose)
    assert set(numbers) <= set(re.findall(r"\*\*(\d+)\*\*", headline)), numbers


def test_a_small_run_gives_each_kind_of_row(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(fac=FACTORIES)
    monkeypatch.setenv("NB_BREAK", "1")
    monkeypatch.setattr("pytest_nobreak.models.skips.MAX_PARAMS", 1000)
    result = pytester.runpytest(
        *QUIET,
        *("--nobreak-model", "fac.py:mlp", "--nobreak-model", "fac.py:branchy"),
        *("--nobreak-model", "fac.py:mixed", "--nobreak-model", "hf:bert"),
        *("--nobreak-model", "fac.py:slow", "--nobreak-model-timeout", "4"),
        *("--asic-backend", "-k", "compiles_whole or on_dut", "--nobreak-json", "r.json"),
    )
    # hf:bert is named and cannot be built at this size: its two checks fail (not skip), and
    # the table still has it as "not built".
    result.assert_outcomes(passed=3, failed=7)
    report = json.loads((pytester.path / "r.json").read_text(encoding="utf-8"))
    assert report["families"] == {"hf:bert": "encoder"}
    assert main([str(pytester.path / "r.json"), str(pytester.path / "zoo.md")]) == 0
    lines = (pytester.path / "zoo.md").read_text().splitlines()
    pytest.LineMatcher(lines).fnmatch_lines(
        [
            "- architectures: **5**, built and run eagerly: **4**",
            "- compile whole (no graph break, no eager fallback): **2**",
            "- whole and 100% on the DUT, within the int8 bound of fp32: **1**",
            # The report names each model's family; the factories, the user's code, have none.
            "| **transformers** | 1 | 0 | 0 | 0 |",
            "| encoder | 1 | 0 | 0 | 0 |",
            "| **factories** | 4 | 4 | 2 | 1 |",
            "Of the 4 that are not whole and on the DUT:",
            "- 1 are not built: 1 are over the parameter limit after shrinking",
            "- 1 do not finish: 1 hit the time limit",
            "- 1 do not compile whole: 1 break the graph",
            "- 1 compile whole but are not all on the DUT: 1 leave ops on the host",
            "Most common reasons for the rest:",
            "- 1 × break GB0170 (Data-dependent branching)",
            "- 1 × host ops: linear",
            "- 1 × not built: still … parameters after shrinking …",
            "- 1 × not finished: compiles_whole took more than … …",
            "| `fac.py:branchy` | breaks: GB0170 | 0 | 0 | 100.0% | none | * | *% |  |",
            "| `fac.py:mixed` | whole | 0 | 0 | 66.7% | linear | * | *% |  |",
            "| `fac.py:mlp` | whole | 0 | 0 | 100.0% | none | * | *% |  |",
            "| `fac.py:slow` | not finished; compiles_whole took more than 4s * |*",
            "| `hf:bert` | not built: still 0M parameters after shrinking (limit 0M) |"
            " | | | | | | |",
        ]
    )


def test_the_exports_column_and_pass_rates(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(fac=FACTORIES)
    monkeypatch.setenv("NB_BREAK", "1")
    specs = ("mlp", "branchy", "capped", "pinned", "size_branch", "mixed")
    result = pytester.runpytest(
        *QUIET,
        *(arg for spec in specs for arg in ("--nobreak-model", f"fac.py:{spec}")),
        *("--asic-backend", "-k", "exports", "--nobreak-json", "r.json"),
    )
    result.assert_outcomes(passed=3, failed=3)
    assert main([str(pytester.path / "r.json"), str(pytester.path / "zoo.md")]) == 0
    lines = (pytester.path / "zoo.md").read_text().splitlines()
    both = "(non-strict and strict)"
    pytest.LineMatcher(lines).fnmatch_lines(
        [
            "- `torch.export` checked: **6**, sound in both modes (batch and sequence kept "
            "dynamic): **3**; a program exported (non-strict: **5**, strict: **5**)",
            # mixed's double-precision head stays on the host, counted: not all on the DUT.
            "- exported programs lowered and run on the DUT: **5**, all MACs on the DUT: **4** "
            "(*% of their MACs)",
            "Most common export problems (models with each):",
            "- 1 × GB0170 (non-strict and strict)",
            "- 1 × dimension kept dynamic but sizes in its range rejected",
            "- 1 × dimension made static",
            "- 1 × dimension narrowed",
            "| model | graph | * | exports |",
            "|---|---|---:|---:|---:|---|---:|---:|---|",
            f"| `fac.py:branchy` | * | GB0170 {both} |",
            f"| `fac.py:capped` | * | sound; narrowed: args[[]0[]] dim 0 (Dim.AUTO) {both} |",
            "| `fac.py:mixed` | * | sound |",
            "| `fac.py:mlp` | * | sound |",
            f"| `fac.py:pinned` | * | static: args[[]0[]] dim 0 (Dim.AUTO) {both} |",
            f"| `fac.py:size_branch` | * | rejects sizes: args[[]0[]] dim 0 (Dim.AUTO) {both} |",
        ]
    )


def test_the_command_runs_as_a_module_and_refuses_a_report_without_models(
    tmp_path: Path,
) -> None:
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"version": 1, "torch": "2", "backend": "asic", "tests": {}}))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_nobreak", "zoo", str(report), str(tmp_path / "z.md")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr == f"error: {report} holds no --nobreak-model check\n"
    assert not (tmp_path / "z.md").exists()


def test_a_malformed_entry_or_the_report_as_output_is_one_line(tmp_path: Path) -> None:
    report = {
        "version": 1,
        "torch": "2.13.0",
        "backend": "asic",
        "device": "default",
        "tests": {"nobreak-model[hf:x]::on_dut": {"outcome": "passed", "breaks": "none"}},
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    for output in (tmp_path / "zoo.md", path):
        done = subprocess.run(
            [sys.executable, "-m", "pytest_nobreak", "zoo", str(path), str(output)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 1
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "zoo.md").exists()
    assert json.loads(path.read_text()) == report


def test_the_counts_per_library_and_family() -> None:
    """The table under the headline counts each library's models, then each family's, from the
    report's ``families`` section (an LLM, an encoder, a vision model and an unbuilt one)."""
    report = json.loads((ROOT / "docs" / "zoo.json").read_text(encoding="utf-8"))
    specs = ("hf:llama", "hf:bert", "hf:vit", "hf:luke")
    prefixes = tuple(f"nobreak-model[{spec}]::" for spec in specs)
    report["tests"] = {k: v for k, v in report["tests"].items() if k.startswith(prefixes)}
    report["models"] = {k: v for k, v in report["models"].items() if k.startswith(prefixes)}
    for nodeid, entry in report["tests"].items():  # luke as a model that was not built
        if nodeid.startswith("nobreak-model[hf:luke]"):
            entry["outcome"] = "skipped"
            report["models"][nodeid] = {"reason": "hf:luke: too big", "finished": False}
    report["families"] = {
        "hf:llama": "LLM",
        "hf:bert": "encoder",
        "hf:vit": "vision",
        "hf:luke": "encoder",
    }
    lines = render_zoo(report).splitlines()
    start = lines.index(
        "| library / family | architectures | built and run | compile whole "
        "| whole and on the DUT |"
    )
    assert lines[start + 2 : start + 6] == [
        "| **transformers** | 4 | 3 | 3 | 3 |",
        "| LLM | 1 | 1 | 1 | 1 |",
        "| encoder | 2 | 1 | 1 | 1 |",
        "| vision | 1 | 1 | 1 | 1 |",
    ]
