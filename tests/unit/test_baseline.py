"""The baseline file: validation, comparison rules, merging and deterministic output."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_nobreak.gate.baseline import (
    BETTER,
    Baseline,
    BaselineError,
    Change,
    Comparison,
    compare,
    dump_baseline,
    load_baseline,
    updated,
    write_baseline,
)
from pytest_nobreak.watch.events import ALL_FIGURES, ASIC_FIGURES, Figures

A = "tests/test_m.py::test_a"
B = "tests/test_m.py::test_b"
C = "tests/test_m.py::test_c[x|y]"

CLEAN = Figures(graphs=1)
ASIC = Figures(graphs=1, dut_ops=2, host_fallbacks=0, macs=4096, cycles=1200)


def base(entries: dict[str, Figures], torch: str = "2.13.0", asic: str | None = "1") -> Baseline:
    return Baseline(torch=torch, asic_sim=asic, entries=entries)


def run(
    baseline: Baseline | None,
    results: dict[str, Figures],
    *,
    strict: bool = False,
    torch: str = "2.13.0",
    asic: str | None = "1",
) -> Comparison:
    return compare(baseline, results, strict=strict, torch=torch, asic_sim=asic)


# ----------------------------------------------------------------------------- the file


def test_dump_is_sorted_integer_json_with_a_header(tmp_path: Path) -> None:
    text = dump_baseline(base({B: ASIC, A: CLEAN}))
    assert text.endswith("}\n")
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"
    assert json.loads(text) == {
        "asic_sim": "1",
        "torch": "2.13.0",
        "version": 1,
        "tests": {
            A: {"graphs": 1, "graph_breaks": 0, "eager_frames": 0, "recompiles": 0},
            B: {
                "graphs": 1,
                "graph_breaks": 0,
                "eager_frames": 0,
                "recompiles": 0,
                "dut_ops": 2,
                "host_fallbacks": 0,
                "macs": 4096,
                "cycles": 1200,
            },
        },
    }


def test_dump_does_not_depend_on_insertion_order() -> None:
    assert dump_baseline(base({A: CLEAN, B: ASIC})) == dump_baseline(base({B: ASIC, A: CLEAN}))


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "nobreak-baseline.json"
    original = base({A: CLEAN, B: ASIC, C: Figures(graphs=3, graph_breaks=2)}, asic=None)
    write_baseline(path, original)
    loaded = load_baseline(path)
    assert loaded == original
    assert loaded is not None
    assert dump_baseline(loaded) == path.read_text(encoding="utf-8")


def test_a_missing_file_is_no_baseline(tmp_path: Path) -> None:
    assert load_baseline(tmp_path / "nope.json") is None


def test_a_byte_order_mark_is_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_bytes(b"\xef\xbb\xbf" + dump_baseline(base({A: CLEAN})).encode())
    assert load_baseline(path) == base({A: CLEAN})


def test_baseline_refuses_figures_that_must_never_reach_the_file() -> None:
    with pytest.raises(ValueError, match="cycles"):
        base({A: Figures(dut_ops=1, host_fallbacks=0, macs=1, cycles=1.5)})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="graph_breaks"):
        base({A: Figures(graph_breaks=-1)})


def test_entries_are_a_read_only_copy() -> None:
    entries = {A: CLEAN}
    baseline = base(entries)
    entries[B] = CLEAN
    assert list(baseline.entries) == [A]
    with pytest.raises(TypeError):
        baseline.entries[B] = CLEAN  # type: ignore[index]


def entry(**figures: object) -> dict[str, object]:
    core: dict[str, object] = {"graphs": 1, "graph_breaks": 0, "eager_frames": 0, "recompiles": 0}
    core.update(figures)
    return {k: v for k, v in core.items() if v is not ...}


def document(tests: object = None, **header: object) -> str:
    doc: dict[str, object] = {"version": 1, "torch": "2.13.0", "asic_sim": None}
    doc["tests"] = {A: entry()} if tests is None else tests
    doc.update(header)
    return json.dumps({k: v for k, v in doc.items() if v is not ...}, indent=2)


CONFLICT = '{\n<<<<<<< HEAD\n  "version": 1,\n=======\n  "version": 1,\n>>>>>>> main\n}\n'

CORRUPT = {
    "empty": (b"", "is empty"),
    "whitespace": (b"  \n", "is empty"),
    "truncated": (b'{"version": 1, "tests": {', "not valid JSON: Expecting property name"),
    "trailing comma": (b'{"version": 1,}', "at line 1, column 15"),
    "merge conflict": (CONFLICT.encode(), "git merge conflict marker at line 2"),
    "not utf-8": (b'{"torch": "\xff"}', "is not UTF-8 text"),
    "array": (b"[]", "must be a JSON object, not an array"),
    "no version": (document(version=...), 'has no "version" key'),
    "newer version": (document(version=2), "is version 2, this pytest-nobreak reads version 1"),
    "version 0": (document(version=0), "is version 0"),
    "version string": (document(version="1"), '"version" must be the integer 1, not "1"'),
    "version bool": (document(version=True), '"version" must be the integer 1, not true'),
    "no torch": (document(torch=...), 'has no "torch" key'),
    "no tests": (document(tests=...), 'has no "tests" key'),
    "unknown key": (document(tset={}), 'has an unknown key "tset"'),
    "torch number": (document(torch=2.13), '"torch" must be a version string, not 2.13'),
    "asic_sim number": (document(asic_sim=1), '"asic_sim" must be a version string or null'),
    "tests list": (document(tests=[]), '"tests" must be an object keyed by test id, not an array'),
    "entry not object": (document(tests={A: 3}), f'test "{A}" must map figure names'),
    "empty nodeid": (document(tests={"": entry()}), "a test with an empty id"),
    "float": (document(tests={A: entry(graphs=1.5)}), f'test "{A}" figure "graphs" is 1.5,'),
    "float integral": (document(tests={A: entry(graphs=1.0)}), '"graphs" is 1.0, not an integer'),
    "negative": (document(tests={A: entry(recompiles=-1)}), '"recompiles" is -1, not an integer'),
    "string": (document(tests={A: entry(graph_breaks="2")}), '"graph_breaks" is "2"'),
    "bool": (document(tests={A: entry(eager_frames=True)}), '"eager_frames" is true'),
    "null": (document(tests={A: entry(graphs=None)}), '"graphs" is null'),
    "nan": (
        b'{"version": 1, "torch": "2", "asic_sim": null, "tests": {"t": {"graphs": NaN}}}',
        '"graphs" is NaN',
    ),
    "unknown figure": (document(tests={A: entry(graph_break=0)}), 'unknown figure "graph_break"'),
    "missing figure": (document(tests={A: entry(recompiles=...)}), 'has no figure "recompiles"'),
    "partial asic": (
        document(tests={A: entry(dut_ops=1, host_fallbacks=0)}),
        "has some ASIC figures but not macs, cycles: give all of dut_ops, host_fallbacks, macs, "
        "cycles or none",
    ),
    "host_macs alone": (
        document(tests={A: entry(host_macs=0)}),
        "has some ASIC figures but not dut_ops, host_fallbacks, macs, cycles",
    ),
    "duplicate test": (
        f'{{"version": 1, "torch": "2", "asic_sim": null, "tests": {{"{A}": {{}}, "{A}": {{}}}}}}',
        f'has the key "{A}" twice',
    ),
    "newline in nodeid": (document(tests={"a\nb": entry(graphs=-2)}), 'test "a\\nb" figure'),
}


@pytest.mark.parametrize(("content", "expected"), CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_file_gives_one_line_naming_the_problem_and_is_left_alone(
    tmp_path: Path, content: str | bytes, expected: str
) -> None:
    path = tmp_path / "nobreak-baseline.json"
    raw = content.encode() if isinstance(content, str) else content
    path.write_bytes(raw)
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    message = str(info.value)
    assert expected in message
    assert message.startswith(f"baseline file {path}: ")
    assert "--nobreak-update-baseline" in message
    assert "\n" not in message
    assert path.read_bytes() == raw


def test_an_unreadable_path_is_a_baseline_error(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="cannot be read"):
        load_baseline(tmp_path)  # a directory


def test_every_hand_written_valid_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    asic = dict.fromkeys(ASIC_FIGURES, 0)
    path.write_text(document(tests={A: entry(), B: entry(**asic)}, asic_sim="1"))
    loaded = load_baseline(path)
    assert loaded == base({A: CLEAN, B: Figures(graphs=1, **asic)}, asic="1")


def test_an_entry_recorded_before_host_macs_loads_without_it(tmp_path: Path) -> None:
    """Baselines written before host_macs existed have the other four ASIC figures: host_macs
    is "not measured" there (None, left out of the entry), not 0."""
    path = tmp_path / "b.json"
    old = entry(dut_ops=2, host_fallbacks=1, macs=4096, cycles=1200)
    path.write_text(document(tests={A: old}, asic_sim="1"))
    loaded = load_baseline(path)
    assert loaded is not None
    assert loaded.entries[A] == Figures(
        graphs=1, dut_ops=2, host_fallbacks=1, macs=4096, cycles=1200
    )
    assert loaded.entries[A].host_macs is None
    assert "host_macs" not in loaded.entries[A].as_dict()
    assert json.loads(dump_baseline(loaded))["tests"][A] == old  # not written as 0 either


# ----------------------------------------------------------------------------- comparison

# Written out again on purpose: a change to the direction table must be a deliberate one.
EXPECTED_DIRECTIONS = {
    "graphs": "lower",
    "graph_breaks": "lower",
    "eager_frames": "lower",
    "recompiles": "lower",
    "host_syncs": "lower",
    "foreign_breaks": "lower",
    "export_problems": "lower",
    "specialized_dims": "lower",
    "dut_ops": "higher",
    "host_fallbacks": "lower",
    "macs": "higher",
    "host_macs": "lower",
    "cycles": "lower",
    "syncs": "lower",
}


def test_the_direction_table_covers_every_figure() -> None:
    assert dict(BETTER) == EXPECTED_DIRECTIONS
    assert set(BETTER) == set(ALL_FIGURES)


@pytest.mark.parametrize("figure", ALL_FIGURES)
@pytest.mark.parametrize("delta", [+1, -1])
def test_a_figure_moving_the_wrong_way_is_a_regression(figure: str, delta: int) -> None:
    before = Figures(**dict.fromkeys(ALL_FIGURES, 10))
    after = Figures(**{**dict.fromkeys(ALL_FIGURES, 10), figure: 10 + delta})
    result = run(base({A: before}), {A: after})
    change = Change(A, figure, 10, 10 + delta)
    worse = (delta > 0) == (EXPECTED_DIRECTIONS[figure] == "lower")
    assert result.regressions == ((change,) if worse else ())
    assert result.improvements == (() if worse else (change,))
    assert result.failed is worse


def test_identical_figures_say_nothing() -> None:
    result = run(base({A: ASIC, B: CLEAN}), {A: ASIC, B: CLEAN})
    assert result == Comparison(strict=False, ran=2)
    assert not result.failed
    assert not result.changed
    assert result.render_lines() == []


def test_tests_that_did_not_run_are_not_reported() -> None:
    result = run(base({A: CLEAN, B: Figures(graphs=7)}), {A: CLEAN})
    assert not result.changed


def test_several_figures_of_several_tests_in_a_stable_order() -> None:
    result = run(
        base({B: CLEAN, A: CLEAN}),
        {B: Figures(graphs=2, graph_breaks=1), A: Figures(graphs=1, recompiles=3)},
    )
    assert result.regressions == (
        Change(A, "recompiles", 0, 3),
        Change(B, "graphs", 1, 2),
        Change(B, "graph_breaks", 0, 1),
    )
    assert list(result.by_test()) == [A, B]
    assert result.by_test()[B] == (Change(B, "graphs", 1, 2), Change(B, "graph_breaks", 0, 1))


def test_a_test_missing_from_the_baseline_warns_and_fails_only_when_strict() -> None:
    lenient = run(base({A: CLEAN}), {A: CLEAN, B: CLEAN})
    assert lenient.missing == (B,)
    assert not lenient.failed
    assert lenient.render_lines()[0] == (f"missing    {B}  not in the baseline", "yellow")

    strict = run(base({A: CLEAN}), {A: CLEAN, B: CLEAN}, strict=True)
    assert strict.failed
    assert strict.render_lines()[0] == (f"MISSING    {B}  not in the baseline (strict)", "red")


def test_no_baseline_file_makes_every_test_missing() -> None:
    result = run(None, {B: CLEAN, A: CLEAN}, strict=True)
    assert result.missing == (A, B)
    assert result.version_mismatch is None
    assert result.failed


def test_a_torch_mismatch_turns_regressions_into_warnings() -> None:
    result = run(base({A: CLEAN}, torch="2.12.0"), {A: Figures(graphs=2, graph_breaks=1)})
    assert result.version_mismatch == "torch 2.12.0 (this run: 2.13.0)"
    assert len(result.regressions) == 2
    assert not result.failed
    lines = result.render_lines()
    assert lines[0][1] == "yellow"
    assert "torch 2.12.0 (this run: 2.13.0)" in lines[0][0]
    assert (f"regression {A}  graphs 1 -> 2", "yellow") in lines
    assert all(style != "red" for _, style in lines)


def test_a_mismatch_does_not_excuse_a_missing_test_under_strict() -> None:
    result = run(base({A: CLEAN}, torch="2.12.0"), {A: CLEAN, B: CLEAN}, strict=True)
    assert result.failed


def test_a_local_build_tag_is_not_a_different_torch() -> None:
    result = run(base({A: CLEAN}, torch="2.13.0+cu126"), {A: Figures(graphs=2)}, torch="2.13.0+cpu")
    assert result.version_mismatch is None
    assert result.failed


def test_a_different_simulator_version_is_a_mismatch() -> None:
    result = run(base({A: ASIC}, asic="1"), {A: ASIC}, asic=None)
    assert result.version_mismatch == "asic_sim 1 (this run: none)"
    assert result.changed
    assert not result.failed


def test_a_test_that_stopped_reaching_the_asic_regresses_on_dut_ops_only() -> None:
    result = run(base({A: ASIC}), {A: CLEAN})
    assert result.regressions == (Change(A, "dut_ops", 2, None),)
    assert result.improvements == ()
    assert result.regressions[0].describe() == "dut_ops 2 -> -"


def test_a_test_that_newly_reaches_the_asic_improves_on_dut_ops_only() -> None:
    result = run(base({A: CLEAN}), {A: ASIC})
    assert result.improvements == (Change(A, "dut_ops", None, 2),)
    assert result.regressions == ()


def test_host_macs_against_an_entry_from_before_them_is_no_change() -> None:
    """No spurious regression on the upgrade: the old entry did not measure host MACs."""
    now = dataclasses.replace(ASIC, host_fallbacks=1, host_macs=512)
    result = run(base({A: dataclasses.replace(ASIC, host_fallbacks=1)}), {A: now})
    assert not result.changed
    # Once recorded, host_macs gates like any other figure.
    result = run(base({A: now}), {A: dataclasses.replace(now, host_macs=1024)})
    assert result.regressions == (Change(A, "host_macs", 512, 1024),)
    assert result.failed
    assert result.render_lines()[0] == (f"REGRESSION {A}  host_macs 512 -> 1024", "red")


def test_work_moving_onto_the_dut_is_an_improvement_cycles_included() -> None:
    host = dataclasses.replace(
        ASIC, dut_ops=1, macs=1024, host_fallbacks=1, host_macs=3072, cycles=300
    )
    dut = dataclasses.replace(ASIC, host_macs=0)  # 4096 MACs on the DUT, 1200 cycles
    result = run(base({A: host}), {A: dut})
    assert not result.regressions
    assert {c.figure for c in result.improvements} == {
        "dut_ops",
        "host_fallbacks",
        "macs",
        "host_macs",
        "cycles",
    }
    # The other way, every figure regresses but cycles (less work on the DUT is fewer cycles).
    result = run(base({A: dut}), {A: host})
    assert {c.figure for c in result.regressions} == {
        "dut_ops",
        "host_fallbacks",
        "macs",
        "host_macs",
    }
    assert [c.figure for c in result.improvements] == ["cycles"]


def test_more_cycles_for_the_same_dut_work_is_a_regression() -> None:
    slower = dataclasses.replace(ASIC, cycles=1500)
    assert run(base({A: ASIC}), {A: slower}).regressions == (Change(A, "cycles", 1200, 1500),)


def test_asic_figures_of_zero_ops_on_one_side_are_no_change() -> None:
    zero = Figures(graphs=1, dut_ops=0, host_fallbacks=0, macs=0, cycles=0)
    assert not run(base({A: zero}), {A: CLEAN}).changed


# ----------------------------------------------------------------------------- rendering


def test_render_lines_for_a_regression_an_improvement_and_the_hint() -> None:
    result = run(
        base({A: CLEAN, B: ASIC}),
        {
            A: Figures(graphs=1, graph_breaks=2),
            B: Figures(graphs=1, dut_ops=2, host_fallbacks=0, macs=4096, cycles=900),
        },
    )
    assert result.render_lines() == [
        (f"REGRESSION {A}  graph_breaks 0 -> 2", "red"),
        (f"improved   {B}  cycles 1200 -> 900", "green"),
        (
            "if this is intended, run pytest --nobreak-update-baseline to accept "
            "(rewrites only the tests that ran)",
            None,
        ),
    ]


def test_improvements_alone_suggest_ratcheting() -> None:
    result = run(base({A: Figures(graphs=2)}), {A: CLEAN})
    assert not result.failed
    assert result.render_lines()[-1] == (
        "run pytest --nobreak-update-baseline to ratchet the baseline down "
        "(rewrites only the tests that ran)",
        None,
    )


def test_render_lines_while_updating_accept_everything() -> None:
    result = run(base({A: CLEAN}), {A: Figures(graphs=2), B: CLEAN})
    lines = result.render_lines(updating=True)
    assert lines == [
        (f"accepted   {A}  graphs 1 -> 2", "yellow"),
        (f"recorded   {B}  new entry", None),
        ("baseline updated: rewrote the 2 tests that ran, kept the others", None),
    ]


# ----------------------------------------------------------------------------- merging


def test_updated_rewrites_the_tests_that_ran_and_keeps_the_others() -> None:
    old = base({A: CLEAN, B: ASIC}, torch="2.12.0")
    new = updated(old, {B: Figures(graphs=2), C: CLEAN}, "2.13.0", None)
    assert new == Baseline(
        torch="2.13.0", asic_sim=None, entries={A: CLEAN, B: Figures(graphs=2), C: CLEAN}
    )
    assert old.entries[B] == ASIC  # the old baseline is not modified


def test_updated_from_nothing_records_a_first_baseline() -> None:
    assert updated(None, {A: CLEAN}, "2.13.0", "1") == base({A: CLEAN})


def test_update_after_a_partial_run_then_compare_is_clean(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    write_baseline(path, base({A: CLEAN, B: ASIC}))
    before = path.read_bytes()
    loaded = load_baseline(path)
    write_baseline(path, updated(loaded, {A: CLEAN}, "2.13.0", "1"))
    assert path.read_bytes() == before  # nothing moved: byte-identical, no churn
    reloaded = load_baseline(path)
    assert not run(reloaded, {A: CLEAN, B: ASIC}, strict=True).changed
