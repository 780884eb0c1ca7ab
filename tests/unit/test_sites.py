"""Where a break is for the user: their innermost line, the library it was in, their calls."""

from __future__ import annotations

import os
import sysconfig

from pytest_nobreak.watch.events import OWN, CallSite
from pytest_nobreak.watch.sites import (
    MAX_CALL_SITES,
    Frame,
    display_path,
    is_user_file,
    locate,
    owner_of,
)

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


# --------------------------------------------------------------------------- owners

TRANSFORMERS = Frame(os.path.join(SITE, "transformers", "models", "bert", "modeling.py"), 300)
STDLIB_COPY = Frame(os.path.join(STDLIB, "copy.py"), 143, "deepcopy")
MYPKG = Frame(os.path.join(SITE, "mypkg", "layers.py"), 12, "forward")


def test_the_owner_is_the_innermost_frames_library_not_the_users_calling_line() -> None:
    stack = [RUNNER, user("tests/test_m.py", 9), user("m.py", 20), TORCH, TRANSFORMERS]
    assert owner_of(stack) == "transformers"
    location = locate(stack, ROOT)
    assert (location.file, location.line, location.owner) == ("m.py", 20, "transformers")


def test_a_break_in_the_users_own_line_is_theirs_whatever_called_it() -> None:
    # A callback of the user's, called by a library: the break is in the user's code.
    stack = [RUNNER, user("tests/test_m.py", 9), TRANSFORMERS, TORCH, user("m.py", 20)]
    assert owner_of(stack) == OWN
    assert locate(stack, ROOT).owner == OWN


def test_the_standard_library_and_generated_code_belong_to_their_caller() -> None:
    generated = Frame("<string>", 2, "__init__")
    frozen = Frame("<frozen os>", 685, "__setitem__")
    assert owner_of([user("m.py", 20), STDLIB_COPY]) == OWN
    assert owner_of([user("m.py", 20), frozen]) == OWN
    assert owner_of([user("m.py", 20), TRANSFORMERS, STDLIB_COPY, generated]) == "transformers"
    assert owner_of([user("m.py", 20), TORCH, STDLIB_COPY]) == "torch"


def test_what_cannot_be_attributed_is_the_users() -> None:
    # A narrower scope must never hide a problem it cannot place.
    assert owner_of([]) == OWN
    assert owner_of([STDLIB_COPY, Frame("<string>", 1)]) == OWN
    assert locate([], ROOT).owner == OWN


def test_first_party_packages_are_the_users_code_though_installed() -> None:
    stack = [RUNNER, user("tests/test_m.py", 9), MYPKG]
    assert owner_of(stack) == "mypkg"
    assert owner_of(stack, first_party={"mypkg"}) == OWN
    assert not is_user_file(MYPKG.file)
    assert is_user_file(MYPKG.file, first_party={"mypkg"})
    assert not is_user_file(TRANSFORMERS.file, first_party={"mypkg"})
    location = locate(stack, ROOT, first_party={"mypkg"})
    # Their own line, named as the file of the installed package, with no library beside it.
    assert (location.file, location.line, location.library) == (
        os.path.join("mypkg", "layers.py"),
        12,
        None,
    )
    assert location.call_sites == (CallSite(os.path.join("tests", "test_m.py"), 9),)
