"""Where a break is for the user: their innermost line, the library it was in, their calls."""

from __future__ import annotations

import os
import sysconfig

from pytest_nobreak.events import CallSite
from pytest_nobreak.sites import MAX_CALL_SITES, Frame, display_path, is_user_file, locate

ROOT = os.path.join(os.sep, "project")
SITE = sysconfig.get_paths()["purelib"]
STDLIB = sysconfig.get_paths()["stdlib"]


def user(name: str, line: int) -> Frame:
    return Frame(os.path.join(ROOT, name), line)


RUNNER = Frame(os.path.join(SITE, "_pytest", "python.py"), 159, "pytest_pyfunc_call")
TORCH = Frame(os.path.join(SITE, "torch", "nn", "modules", "module.py"), 1789, "_call_impl")


def test_a_break_inside_a_library_is_at_the_nearest_user_line_and_names_the_library() -> None:
    outer_test = Frame(os.path.join(os.sep, "elsewhere", "test_outer.py"), 3)
    stack = [
        outer_test,  # an outer session's test (pytester): beyond the runner, not the user's
        RUNNER,
        user("tests/test_m.py", 9),
        TORCH,
        user("m.py", 20),
        Frame(os.path.join(STDLIB, "os.py"), 685, "__setitem__"),
    ]
    location = locate(stack, ROOT)
    assert (location.file, location.line) == ("m.py", 20)
    assert location.library == "os (os.py:685, in __setitem__)"
    assert location.call_sites == (CallSite(os.path.join("tests", "test_m.py"), 9),)


def test_a_deep_chain_keeps_the_innermost_calls_and_the_outermost() -> None:
    stack = [user("test_m.py", 1), *(user("m.py", line) for line in range(100, 120))]
    sites = locate(stack, ROOT).call_sites
    assert len(sites) == MAX_CALL_SITES
    assert [s.line for s in sites[:2]] == [118, 117]
    assert sites[-1] == CallSite("test_m.py", 1)


def test_paths_are_relative_to_the_root_or_to_the_librarys_install_directory() -> None:
    assert display_path(os.path.join(ROOT, "pkg", "m.py"), ROOT) == os.path.join("pkg", "m.py")
    assert display_path(TORCH.file, ROOT) == os.path.join("torch", "nn", "modules", "module.py")
    assert display_path("<frozen os>", ROOT) == "<frozen os>"
    assert not is_user_file(TORCH.file)
    assert not is_user_file("<frozen os>")
    assert is_user_file(os.path.join(ROOT, "m.py"))
