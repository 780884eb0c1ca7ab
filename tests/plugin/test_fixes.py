"""Each gb id of the fixes table is tested: a tiny example of its break fails the marker with
that id and the fix in its own entry, passes without the plugin, and the same example rewritten
as the fix says passes the marker with the outputs the broken one gives eagerly; every rewrite
rule and every template is checked against its text, written out here.

The examples are the patterns users hit most (measured on torch 2.13 and Python 3.11; the ids
are Dynamo's). One id of the table is not caught by the marker: GB0003, a generator function
compiled itself, which Dynamo refuses before tracing it (a test below documents it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from pytest_nobreak.watch.fixes import FIXES, Rules, code_of, fix_for
from tests import zygote

# One module of marked tests: test_broken_<name> breaks, test_fixed_<name> is its rewrite.
EXAMPLES = r"""
import contextlib
import io
import logging
import os
import threading

import numpy as np
import pytest
import torch
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

mark = pytest.mark.no_graph_break
log = logging.getLogger("model")


def run(fn, *args, backend="eager", **kw):
    return torch.compile(fn, backend=backend, **kw)(*args)


X = torch.tensor([0.2, 0.9, 0.4, 0.7])


# 1. data-dependent branch (GB0170)
def branchy(t):
    h = t * 2
    if t.mean() > 0.5: h = h * 0.5
    return h

def branchless(t):
    h = t * 2
    h = torch.where(t.mean() > 0.5, h * 0.5, h)
    return h

@mark
def test_broken_branch():
    run(branchy, X)

@mark
def test_fixed_branch():
    assert torch.equal(run(branchless, X), branchy(X))


# 2. a value read into Python (GB0124; .tolist() GB0109)
def item(x):
    s = x.sum().item()
    return x / s

def no_item(x):
    s = x.sum()
    return x / s

def tolist(x):
    return x * sum(x.tolist())

def no_tolist(x):
    return x * x.sum()

@mark
def test_broken_item():
    run(item, X)

@mark
def test_fixed_item():
    assert torch.allclose(run(no_item, X), item(X))

@mark
def test_broken_tolist():
    run(tolist, X)

@mark
def test_fixed_tolist():
    assert torch.allclose(run(no_tolist, X), tolist(X))


# 3. print and logging (GB0059, GB0291)
def printing(x):
    y = x * 2
    print("y =", y)
    return y + 1

def logging_(x):
    log.info("step")
    return x + 1

def quiet(x):
    y = x * 2
    return y + 1

def quiet_add(x):
    return x + 1

@mark
def test_broken_print():
    run(printing, X)

@mark
def test_broken_logging():
    run(logging_, X)

@mark
def test_fixed_logging():
    y = run(quiet_add, X)
    log.info("step")  # in the caller
    assert torch.equal(y, logging_(X))

@mark
def test_fixed_print():
    y = run(quiet, X)
    print("y =", y - 1)  # in the caller
    assert torch.equal(y, printing(X))


# 4. a torch.compiler.disable()d callee (GB0098)
@torch.compiler.disable
def disabled_helper(x):
    return torch.relu(x) + 1

def helper(x):
    return torch.relu(x) + 1

def calls_disabled(x):
    return disabled_helper(x) * 2

def calls_helper(x):
    return helper(x) * 2

@mark
def test_broken_disabled():
    run(calls_disabled, X)

@mark
def test_fixed_disabled():
    assert torch.equal(run(calls_helper, X), calls_disabled(X))


# 5. an untraceable C function (GB0007)
def reads_pid(x):
    pid = os.getpid()
    return x + pid % 7

def takes_pid(x, pid):
    return x + pid % 7

@mark
def test_broken_c_function():
    run(reads_pid, X)

@mark
def test_fixed_c_function():
    pid = os.getpid()
    assert torch.equal(run(takes_pid, X, pid), reads_pid(X))


# 6. an unsupported context manager (GB0142)
LOCK = threading.Lock()

def locked(x):
    with LOCK:
        return x * 2 + 1

def unlocked(x):
    return x * 2 + 1

@mark
def test_broken_context_manager():
    run(locked, X)

@mark
def test_fixed_context_manager():
    expected = locked(X)
    with LOCK:
        out = run(unlocked, X)
    assert torch.equal(out, expected)


# 7. a generator passed in (GB0811)
def doubled_sum(xs):
    return sum(t * 2 for t in xs)

@mark
def test_broken_generator():
    run(doubled_sum, (t for t in (X, X + 1)))

@mark
def test_fixed_generator():
    out = run(doubled_sum, tuple(t for t in (X, X + 1)))
    assert torch.equal(out, doubled_sum(t for t in (X, X + 1)))


# 8. a data-dependent shape (GB0036)
def masked(x):
    return x[x > 0.5].sum()

def where(x):
    return torch.where(x > 0.5, x, 0).sum()

@mark
def test_broken_mask():
    run(masked, X)

@mark
def test_fixed_mask():
    assert torch.equal(run(where, X), masked(X))


# 9. a backend compiler exception (GB0219): a backend that re-propagates fake shapes on its own
def shape_prop(gm, example_inputs):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode()).propagate(
        *[torch.empty(t.shape, dtype=t.dtype) for t in example_inputs]
    )
    return gm

VENDOR = aot_autograd(fw_compiler=shape_prop)

def clamp_host(x):
    return x.clamp(max=x.mean().item())

@torch.library.custom_op("fixes::clamp_to_mean", mutates_args=())
def clamp_to_mean(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(max=x.mean().item())

@clamp_to_mean.register_fake
def _(x):
    return torch.empty_like(x)

def clamp_op(x):
    return clamp_to_mean(x)

@mark
def test_broken_backend():
    with pytest.raises(Exception):
        run(clamp_host, X, backend=VENDOR, fullgraph=True)

@mark
def test_fixed_backend():
    out = run(clamp_op, X, backend=VENDOR, fullgraph=True)
    assert torch.equal(out, clamp_host(X))


# 10. the recompile limit from a Python int (GB0039)
def times_two_n(x, n):
    for _ in range(n):
        x = x * 2
    return x

def times_pow(x, n):
    return x * torch.pow(2.0, n)

@mark
def test_broken_recompiles():
    fn = torch.compile(times_two_n, backend="eager")
    for n in range(1, 11):
        fn(X, n)

@mark
def test_fixed_recompiles():
    fn = torch.compile(times_pow, backend="eager")
    for n in range(1, 11):
        assert torch.equal(fn(X, torch.tensor(n)), times_two_n(X, n))


# 11. the recompile limit from changing shapes (GB0039)
def scale_by_len(x):
    return x * 2 + x.shape[0]

@mark
def test_broken_shapes():
    fn = torch.compile(scale_by_len, backend="eager", dynamic=False)
    for n in range(2, 12):
        fn(torch.arange(n, dtype=torch.float32))

@mark
def test_fixed_shapes():
    fn = torch.compile(scale_by_len, backend="eager", dynamic=False)
    for n in range(2, 12):
        t = torch.arange(n, dtype=torch.float32)
        torch._dynamo.mark_dynamic(t, 0)
        assert torch.equal(fn(t), scale_by_len(t))


# 12. an unsupported Tensor method (GB0123)
def trains(w):
    loss = (w * w).sum()
    loss.backward()
    return w.grad

def loss_only(w):
    return (w * w).sum()

@mark
def test_broken_backward():
    run(trains, X.clone().requires_grad_())

@mark
def test_fixed_backward():
    w = X.clone().requires_grad_()
    loss = run(loss_only, w)
    loss.backward()
    assert torch.equal(w.grad, trains(X.clone().requires_grad_()))


# 13. numpy torch cannot trace (GB0294)
def np_centered(x):
    return x - torch.as_tensor(np.nanmean(x.numpy()))

def torch_centered(x):
    return x - torch.nanmean(x)

@mark
def test_broken_numpy():
    run(np_centered, X)

@mark
def test_fixed_numpy():
    assert torch.allclose(run(torch_centered, X), np_centered(X))


# 14. a module attribute set in forward (GB0264)
class Running(nn.Module):
    def __init__(self):
        super().__init__()
        self.running = nn.Parameter(torch.zeros(4), requires_grad=False)

    def forward(self, x):
        self.running = nn.Parameter(0.9 * self.running + 0.1 * x, requires_grad=False)
        return x - self.running

class RunningBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("running", torch.zeros(4))

    def forward(self, x):
        self.running.copy_(0.9 * self.running + 0.1 * x)
        return x - self.running

@mark
def test_broken_setattr():
    run(Running(), X)

@mark
def test_fixed_setattr():
    assert torch.allclose(run(RunningBuffer(), X), Running()(X))


# 15. a non-tensor output built from a tensor (GB0059, repr GB0569)
def with_text(x):
    y = x * 2
    return y, str(y.max())

def with_repr(x):
    y = x * 2
    return y, f"{y.max()!r}"

def tensors_only(x):
    y = x * 2
    return y, y.max()

@mark
def test_broken_output():
    run(with_text, X)

@mark
def test_broken_repr():
    run(with_repr, X)

@mark
def test_fixed_output():
    y, m = run(tensors_only, X)
    assert (torch.equal(y, with_text(X)[0]), str(m)) == (True, with_text(X)[1])

@mark
def test_fixed_repr():
    y, m = run(tensors_only, X)
    assert (torch.equal(y, with_repr(X)[0]), f"{m!r}") == (True, with_repr(X)[1])


# 16. an int tensor's values read into Python (GB0033: aten._local_scalar_dense of an int)
IDX = torch.tensor([1, 0, 2, 1])

def int_tolist(x, idx):
    return x * sum(idx.tolist())

def int_sum(x, idx):
    return x * idx.sum()

@mark
def test_broken_int_tolist():
    run(int_tolist, X, IDX)

@mark
def test_fixed_int_tolist():
    assert torch.equal(run(int_sum, X, IDX), int_tolist(X, IDX))


# 17. a value Dynamo has no type for, handed to a builtin (GB4841: a logger's attribute)
def tagged(x):
    n = len(log.name)
    return x * n

def tag_passed(x, n):
    return x * n

@mark
def test_broken_attribute():
    run(tagged, X)

@mark
def test_fixed_attribute():
    n = len(log.name)
    assert torch.equal(run(tag_passed, X, n), tagged(X))


# 18. a function of a module Dynamo skips (GB0008: torch.autograd's)
def debug_step(x):
    torch.autograd.set_detect_anomaly(True)
    return x * 2 + 1

@mark
def test_broken_skipped_function():
    try:
        run(debug_step, X)
    finally:
        torch.autograd.set_detect_anomaly(False)

@mark
def test_fixed_skipped_function():
    try:
        expected = debug_step(X)
        torch.autograd.set_detect_anomaly(True)
        assert torch.equal(run(unlocked, X), expected)
    finally:
        torch.autograd.set_detect_anomaly(False)


# 19. a contextlib manager Dynamo does not support (GB0262)
BUF = io.StringIO()

def silenced(x):
    with contextlib.redirect_stdout(BUF):
        return x * 2 + 1

@mark
def test_broken_contextlib():
    run(silenced, X)

@mark
def test_fixed_contextlib():
    expected = silenced(X)
    with contextlib.redirect_stdout(BUF):
        out = run(unlocked, X)
    assert torch.equal(out, expected)


# 20. next() on an iterator made outside the compiled function (GB4347): a module attribute
class Scheduled(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = iter([0.5, 0.25, 0.125])

    def forward(self, x):
        scale = next(self.scales)
        return x * scale

class Scaled(nn.Module):
    def forward(self, x, scale):
        return x * scale

@mark
def test_broken_iterator():
    run(Scheduled(), X)

@mark
def test_fixed_iterator():
    eager, caller = Scheduled(), Scheduled()
    fn = torch.compile(Scaled(), backend="eager")
    for _ in range(3):
        scale = next(caller.scales)  # in the caller
        assert torch.equal(fn(X, scale), eager(X))


# 21. a comprehension in a function Dynamo gave up on (GB4347 on Python 3.11, after GB0142):
# the comprehension is a function of its own, handed iter(d), and compiled alone
def scaled_all(x, d):
    with LOCK:
        return {k: d[k] * 2 for k in d}

def scaled_each(x, d):
    return {k: d[k] * 2 for k in d}

@mark
def test_broken_comprehension():
    run(scaled_all, X, {"a": X})

@mark
def test_fixed_comprehension():
    expected = scaled_all(X, {"a": X})
    with LOCK:
        out = run(scaled_each, X, {"a": X})
    assert out.keys() == expected.keys() and torch.equal(out["a"], expected["a"])


# 22. a generator function compiled itself (GB0003): Dynamo refuses its frame before tracing
# it, so the marker sees an eager frame and no break; Dynamo's own counter has the id
def doubles(xs):
    for t in xs:
        yield t * 2

def doubled(xs):
    return tuple(doubles(xs))

@mark
def test_missed_generator_function():
    out = tuple(torch.compile(doubles, backend="eager")((X, X + 1)))
    assert any("gb0003" in k for k in counters["unimplemented"]), dict(counters)
    assert all(map(torch.equal, out, doubles((X, X + 1))))

@mark
def test_fixed_generator_function():
    out = run(doubled, (X, X + 1))
    assert all(map(torch.equal, out, doubles((X, X + 1))))


# 23. torch.autograd.grad inside (GB9186)
def grad_of(w):
    loss = (w * w).sum()
    return torch.autograd.grad(loss, w)[0]

@mark
def test_broken_autograd_grad():
    run(grad_of, X.clone().requires_grad_())

@mark
def test_fixed_autograd_grad():
    w = X.clone().requires_grad_()
    loss = run(loss_only, w)
    assert torch.equal(torch.autograd.grad(loss, w)[0], grad_of(X.clone().requires_grad_()))


# 24. Tensor.resize_ inside (GB0126)
def grows(x):
    y = x * 2
    y.resize_(2, 2)
    return y

def doubles_only(x):
    return x * 2

@mark
def test_broken_resize():
    run(grows, X)

@mark
def test_fixed_resize():
    y = run(doubles_only, X)
    y.resize_(2, 2)  # on what it returns
    assert torch.equal(y, grows(X))


# 25. requires_grad set inside (GB0206)
def scaled_leaf(x):
    w = torch.ones(4)
    w.requires_grad = True
    return x * w

def times_w(x, w):
    return x * w

@mark
def test_broken_requires_grad():
    run(scaled_leaf, X)

@mark
def test_fixed_requires_grad():
    w = torch.ones(4, requires_grad=True)  # when it is created, outside
    assert torch.equal(run(times_w, X, w), scaled_leaf(X))
"""


@dataclasses.dataclass(frozen=True)
class Broken:
    """What test_broken_<name> fails with: the break ``gb_id`` whose entry shows ``fix``, and
    the ``also`` breaks (id, fix) Dynamo adds at the same place because of it."""

    gb_id: str
    fix: str
    also: tuple[tuple[str, str], ...] = ()


WITH_LOCK = "move `with LOCK:` out of the compiled function: wrap the compiled call in it"
WITH_REDIRECT = (
    "move `with contextlib.redirect_stdout(BUF):` out of the compiled function: wrap the "
    "compiled call in it"
)
RECOMPILES = (
    "mark the dims that vary dynamic: torch._dynamo.mark_dynamic(x, dim) before the call (or "
    "torch.compile(..., dynamic=True)); pass values that change every call as tensors, not "
    "Python ints driving loops or branches"
)
TENSOR_METHOD = (
    "call it outside the compiled region: compile the forward and the loss, and call "
    "backward(), autograd.grad() or resize_() on what it returns"
)

#: test name -> the break it fails with and the fix line its entry (and failure message) shows.
BROKEN = {
    "branch": Broken("GB0170", "h = torch.where(t.mean() > 0.5, h * 0.5, h)"),
    "item": Broken(
        "GB0124", "s = x.sum()  (a 0-d tensor: use it in tensor math, not as a Python number)"
    ),
    "tolist": Broken("GB0109", "x.sum() instead of sum(x.tolist())"),
    "int_tolist": Broken("GB0033", "idx.sum() instead of sum(idx.tolist())"),
    "print": Broken(
        "GB0059",
        'move print("y =", y) to the caller, after the compiled call returns (or add print to '
        "torch._dynamo.config.reorderable_logging_functions)",
    ),
    "output": Broken(
        "GB0059", "return y.max() from the compiled function and call str() on it in the caller"
    ),
    "logging": Broken(
        "GB0291", 'move log.info("step") out of the compiled region (log from the caller)'
    ),
    "repr": Broken(
        "GB0569",
        "call print/logging/str/repr outside the compiled region, on the tensors it returns",
    ),
    "disabled": Broken(
        "GB0098",
        "remove @torch.compiler.disable from disabled_helper (or call disabled_helper outside "
        "the compiled region); if it cannot be traced, fix what stops it instead",
    ),
    "c_function": Broken(
        "GB0007",
        "compute pid = os.getpid() before the compiled call and pass pid in as an argument",
    ),
    "skipped_function": Broken(
        "GB0008",
        "call torch.autograd.set_detect_anomaly(True) outside the compiled function, before the "
        "compiled call",
    ),
    "attribute": Broken(
        "GB4841", "compute n = len(log.name) before the compiled call and pass n in as an argument"
    ),
    "context_manager": Broken("GB0142", WITH_LOCK),
    # Dynamo cannot build the manager (GB0262), then cannot run the with-block in a graph.
    "contextlib": Broken("GB0262", WITH_REDIRECT, also=(("GB0142", WITH_REDIRECT),)),
    "generator": Broken(
        "GB0811",
        "materialize generators and iterators before the compiled call: pass tuple(gen) instead "
        "of gen",
    ),
    "iterator": Broken(
        "GB4347",
        "call next(self.scales) in the caller and pass the value in as an argument (Dynamo cannot "
        "step an iterator made outside the compiled function), or keep a list or tuple and index "
        "it",
    ),
    # Dynamo gives up on scaled_all (GB0142); its comprehension then compiles alone (GB4347).
    "comprehension": Broken(
        "GB4347",
        "this comprehension ran as a function of its own (as Python 3.11 runs one) because "
        "Dynamo gave up on the function around it: fix that function's break (its other entry "
        "here) and the comprehension compiles with it",
        also=(("GB0142", WITH_LOCK),),
    ),
    "mask": Broken("GB0036", "torch.where(x > 0.5, x, 0).sum() instead of x[x > 0.5].sum()"),
    "backend": Broken(
        "GB0219",
        "the backend cannot take aten._local_scalar_dense (a tensor's value read on the host, as "
        ".item() does): compute with the tensor instead (no .item()), or put the host call behind "
        "a torch.library.custom_op with a register_fake, which the backend sees as one opaque op",
    ),
    "recompiles": Broken("GB0039", RECOMPILES),
    "shapes": Broken("GB0039", RECOMPILES),
    "backward": Broken(
        "GB0123",
        "call .backward() outside the compiled region: return the loss from the compiled "
        "function and call loss.backward() on the result",
    ),
    "autograd_grad": Broken("GB9186", TENSOR_METHOD),
    "resize": Broken("GB0126", TENSOR_METHOD),
    "numpy": Broken(
        "GB0294",
        "replace np.nanmean with torch.nanmean on the tensor itself (no .numpy() round trip)",
    ),
    "setattr": Broken(
        "GB0264",
        'self.running.copy_(0.9 * self.running + 0.1 * x), with self.register_buffer("running", '
        "...) in __init__ instead of a Parameter",
    ),
    "requires_grad": Broken(
        "GB0206",
        "set w.requires_grad = True once, outside the compiled call (or when you create it)",
    ),
}
if sys.version_info >= (3, 12):
    # Comprehensions are inlined (PEP 709): only the break that made Dynamo give up is left.
    BROKEN["comprehension"] = Broken("GB0142", WITH_LOCK)

#: The table's ids the marker cannot catch, and the example that shows it.
MISSED = {"GB0003": "generator_function"}
#: Every broken (or missed) example has its rewrite, test_fixed_<name>.
FIXED = [*BROKEN, *MISSED.values()]
ALL = [
    *(f"test_broken_{name}" for name in BROKEN),
    *(f"test_missed_{name}" for name in MISSED.values()),
    *(f"test_fixed_{name}" for name in FIXED),
]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One real pytest run of the examples: its output and, with the plugin, its JSON report's
    tests."""

    returncode: int
    stdout: str
    tests: dict[str, Any]

    def section(self, test: str) -> str:
        """The failure section of ``test`` in the output: from its header to the next one."""
        parts = re.split(r"^_{3,} (test_\w+) _{3,}$", self.stdout, flags=re.MULTILINE)
        return dict(zip(parts[1::2], parts[2::2], strict=True)).get(test, "")


def _run_examples(path: Any, *options: str) -> subprocess.CompletedProcess[str]:
    (path / "test_examples.py").write_text(EXAMPLES)
    return zygote.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "no:xdist", *options, "test_examples.py"],
        cwd=path, timeout=600, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    # One run of the examples serves every test here (pytester is function-scoped).
    path = tmp_path_factory.mktemp("fixes")
    proc = _run_examples(path, "--nobreak-json", "r.json", "-rf")
    report = json.loads((path / "r.json").read_text())
    return Outcome(proc.returncode, proc.stdout, report["tests"])


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    # The same examples without the plugin: what fails above fails because of it.
    proc = _run_examples(tmp_path_factory.mktemp("fixes_control"), "-p", "no:nobreak", "-rp")
    passed = {
        line.split("::", 1)[1].split()[0]: "passed"
        for line in proc.stdout.splitlines()
        if line.startswith("PASSED test_examples.py::")
    }
    return Outcome(proc.returncode, proc.stdout, passed)


def test_every_gb_id_of_the_table_has_an_example() -> None:
    table = {gb_id for fix in FIXES for gb_id in fix.gb_ids}
    examples = {broken.gb_id for broken in BROKEN.values()} | set(MISSED)
    assert examples == table


def test_the_broken_examples_fail_and_the_fixed_ones_pass(outcome: Outcome) -> None:
    assert outcome.returncode == 1, outcome.stdout[-3000:]
    outcomes = {name.split("::", 1)[1]: entry["outcome"] for name, entry in outcome.tests.items()}
    assert outcomes == {
        name: "failed" if name.startswith("test_broken_") else "passed" for name in ALL
    }, outcome.stdout[-3000:]


def test_without_the_plugin_every_example_passes(control: Outcome) -> None:
    assert control.returncode == 0, control.stdout[-3000:]
    assert sorted(control.tests) == sorted(ALL)


@pytest.mark.parametrize("name", list(BROKEN))
def test_each_failure_names_its_break_and_its_fix(outcome: Outcome, name: str) -> None:
    broken = BROKEN[name]
    test = f"test_broken_{name}"
    entry = outcome.tests[f"test_examples.py::{test}"]
    fixes = sorted((b["gb_id"], b["fix"]) for b in entry["breaks"])
    assert fixes == sorted([(broken.gb_id, broken.fix), *broken.also])
    # Its own failure message shows the same fix under the break.
    section = outcome.section(test)
    assert broken.gb_id in section
    assert f"fix: {broken.fix}" in section, section


def test_a_compiled_generator_function_is_only_an_eager_frame(outcome: Outcome) -> None:
    """Dynamo refuses a generator's frame in convert_frame, before it traces anything
    (GB0003): no graph-break log, no compile metrics, so the marker sees one eager frame and
    no break, and passes. test_missed_generator_function asserts Dynamo's own counter has the
    id; its fix is still the table's (tested below), for reports that name it."""
    entry = outcome.tests["test_examples.py::test_missed_generator_function"]
    assert (entry["outcome"], entry["breaks"], entry["eager_frames"]) == ("passed", [], 1)


#: Each fix's template (what a line no rule rewrites gets), by its gb ids.
TEMPLATES = {
    ("GB0170",): (
        "compute both branches and select with torch.where(cond, a, b), or use "
        "torch.cond(cond, true_fn, false_fn, operands); never branch in Python on a tensor"
    ),
    ("GB0124", "GB0109", "GB0033"): (
        "keep the value a tensor (t.sum(), not t.sum().item()) and let broadcasting use it; "
        "or set torch._dynamo.config.capture_scalar_outputs = True"
    ),
    ("GB0059", "GB0291", "GB0569"): (
        "call print/logging/str/repr outside the compiled region, on the tensors it returns"
    ),
    ("GB0098",): (
        "remove @torch.compiler.disable from the callee (or call it outside the compiled "
        "region); if it cannot be traced, fix what stops it instead"
    ),
    ("GB0007", "GB0008", "GB4841"): (
        "call it outside the compiled function and pass its result in as an argument (time "
        "around the compiled call, not inside it)"
    ),
    ("GB0142", "GB0262"): (
        "move the with-block out of the compiled function: wrap the compiled call in it"
    ),
    ("GB0811",): (
        "materialize generators and iterators before the compiled call: pass tuple(gen) "
        "instead of gen"
    ),
    ("GB4347",): (
        "Dynamo cannot call next() on an iterator made outside the code it traces: for a "
        "comprehension (Python 3.11 runs it as a function of its own), fix what made Dynamo "
        "give up on the function around it (its other entry here); for next(it) on an "
        "argument, a global or a module attribute, call next() in the caller and pass the value "
        "in, or keep a list or tuple and index it"
    ),
    ("GB0003",): (
        "compile a plain function that consumes the generator (def f(xs): return "
        "tuple(gen(xs))), not the generator function itself"
    ),
    ("GB0036",): (
        "keep shapes static: torch.where(mask, x, 0) instead of x[mask], mask.sum() to count; "
        "or set torch._dynamo.config.capture_dynamic_output_shape_ops = True"
    ),
    ("GB0219",): (
        "the backend failed on this graph (see raised:): fix the backend, or hide the op it "
        "cannot take behind a torch.library.custom_op with a register_fake"
    ),
    ("GB0039",): RECOMPILES,
    ("GB0123", "GB9186", "GB0126"): TENSOR_METHOD,
    ("GB0294",): "replace the numpy function with its torch equivalent on the tensor itself",
    ("GB0264", "GB0206"): (
        "create parameters and submodules in __init__; keep state in a buffer registered in "
        "__init__ and update it in place with .copy_(); set requires_grad outside the "
        "compiled call"
    ),
}


def test_each_fix_has_its_template() -> None:
    assert {fix.gb_ids: fix.template for fix in FIXES} == TEMPLATES
    for gb_ids, template in TEMPLATES.items():
        for gb_id in gb_ids:
            assert fix_for(gb_id, None) == template
    assert fix_for("GB9999", "x = 1") is None


#: (gb id, the user's line, Dynamo's reason, the fix): every rewrite rule at least once, and
#: lines each rule must leave to the template (or to the next rule).
REWRITES = [
    # GB0170: one plain assignment after the colon; a return; a block's `if`.
    ("GB0170", "if c: h = h * 2  # halve", "", "h = torch.where(c, h * 2, h)"),
    ("GB0170", "if c: h = h * 2  # don't", "", TEMPLATES[("GB0170",)]),
    ("GB0170", "if c: h = 1; g = 2", "", TEMPLATES[("GB0170",)]),
    ("GB0170", "if c: y == z", "", TEMPLATES[("GB0170",)]),
    (
        "GB0170",
        "if x.sum() > 0: return x + 1",
        "",
        "select with torch.where(x.sum() > 0, x + 1, <the other result>) and return it, or "
        "torch.cond(x.sum() > 0, true_fn, false_fn, operands)",
    ),
    (
        "GB0170",
        "elif h.mean() > 0.5:",
        "",
        "compute both branches and select: <var> = torch.where(h.mean() > 0.5, <value if "
        "true>, <value if false>), or torch.cond(h.mean() > 0.5, true_fn, false_fn, operands)",
    ),
    # GB0124/GB0109/GB0033: .item() assigned, sum(t.tolist()), .item() inside an expression,
    # torch.equal and torch.allclose.
    (
        "GB0124",
        "scale = h.abs().max().item()",
        "",
        "scale = h.abs().max()  (a 0-d tensor: use it in tensor math, not as a Python number)",
    ),
    ("GB0109", "return x * sum(x.tolist())", "", "x.sum() instead of sum(x.tolist())"),
    ("GB0124", "n = int(t.item())", "", "use t itself (a tensor) where t.item() is used"),
    (
        "GB0124",
        "return float(x.max().item())",
        "",
        "use x.max() itself (a tensor) where x.max().item() is used",
    ),
    (
        "GB0033",
        "if torch.equal(a, b):",
        "",
        "torch.eq(a, b).all() instead of torch.equal(a, b) (a 0-d bool tensor, not a Python "
        "bool; the shapes must match)",
    ),
    (
        "GB0033",
        "same = torch.allclose(y, ref, atol=1e-3)",
        "",
        "torch.isclose(y, ref, atol=1e-3).all() instead of torch.allclose(y, ref, atol=1e-3) (a "
        "0-d bool tensor, not a Python bool; the shapes must match)",
    ),
    ("GB0033", "return x / math.sqrt(x.sum())", "", TEMPLATES[("GB0124", "GB0109", "GB0033")]),
    # GB0059/GB0291/GB0569: print, a logger's call, str/repr/format of a tensor.
    (
        "GB0059",
        'print("loss", loss)',
        "",
        'move print("loss", loss) to the caller, after the compiled call returns (or add print '
        "to torch._dynamo.config.reorderable_logging_functions)",
    ),
    (
        "GB0291",
        'self.logger.warning("nan in %s", name)',
        "",
        'move self.logger.warning("nan in %s", name) out of the compiled region (log from the '
        "caller)",
    ),
    (
        "GB0569",
        "return y, repr(y.max())",
        "",
        "return y.max() from the compiled function and call repr() on it in the caller",
    ),
    ("GB0569", 'return y, f"{y.max()!r}"', "", TEMPLATES[("GB0059", "GB0291", "GB0569")]),
    # GB0098: the callee's name from Dynamo's reason.
    (
        "GB0098",
        "return helper(x) * 2",
        "Skip calling function `<function Model.helper at 0x7f00>` since it was wrapped with "
        "`torch.compiler.disable` (reason: None)",
        "remove @torch.compiler.disable from helper (or call helper outside the compiled "
        "region); if it cannot be traced, fix what stops it instead",
    ),
    ("GB0098", "return helper(x) * 2", "no function named", TEMPLATES[("GB0098",)]),
    # GB0007/GB0008/GB4841: a line that is just the call, assigned or not, or a with-block.
    (
        "GB0007",
        "t0 = time.perf_counter()",
        "",
        "compute t0 = time.perf_counter() before the compiled call and pass t0 in as an argument",
    ),
    ("GB0007", "y = model(x) + time.time()", "", TEMPLATES[("GB0007", "GB0008", "GB4841")]),
    (
        "GB0007",
        'warnings.warn("slow path")',
        "",
        'call warnings.warn("slow path") outside the compiled function, before the compiled call',
    ),
    (
        "GB0008",
        "with torch.autograd.detect_anomaly():",
        "",
        "move `with torch.autograd.detect_anomaly():` out of the compiled function: wrap the "
        "compiled call in it",
    ),
    (
        "GB4841",
        "n = len(log.name)",
        "",
        "compute n = len(log.name) before the compiled call and pass n in as an argument",
    ),
    # GB0142/GB0262: the with-block.
    (
        "GB0262",
        "with contextlib.redirect_stdout(buf):",
        "",
        "move `with contextlib.redirect_stdout(buf):` out of the compiled function: wrap the "
        "compiled call in it",
    ),
    ("GB0142", "lock.acquire()", "", TEMPLATES[("GB0142", "GB0262")]),
    # GB4347: a comprehension, or next() of an iterator.
    (
        "GB4347",
        "valid = [v.size(0) for v in rows]",
        "",
        "this comprehension ran as a function of its own (as Python 3.11 runs one) because "
        "Dynamo gave up on the function around it: fix that function's break (its other entry "
        "here) and the comprehension compiles with it",
    ),
    (
        "GB4347",
        "return x * next(SCHEDULE)",
        "",
        "call next(SCHEDULE) in the caller and pass the value in as an argument (Dynamo cannot "
        "step an iterator made outside the compiled function), or keep a list or tuple and "
        "index it",
    ),
    ("GB4347", "for batch in loader:", "", TEMPLATES[("GB4347",)]),
    # GB0036: x[mask].sum() and x[mask].mean().
    (
        "GB0036",
        "return x[x > 0.5].sum()",
        "",
        "torch.where(x > 0.5, x, 0).sum() instead of x[x > 0.5].sum()",
    ),
    (
        "GB0036",
        "m = h[h != 0].mean()",
        "",
        "torch.where(h != 0, h, 0).sum() / (h != 0).sum() instead of h[h != 0].mean()",
    ),
    ("GB0036", "idx = x.nonzero()", "", TEMPLATES[("GB0036",)]),
    # GB0219: the host read a backend cannot take, else the template.
    (
        "GB0219",
        "return x.clamp(max=x.mean().item())",
        "backend='vendor' raised: aten._local_scalar_dense.default",
        "the backend cannot take aten._local_scalar_dense (a tensor's value read on the host, as "
        ".item() does): compute with the tensor instead (no .item()), or put the host call behind "
        "a torch.library.custom_op with a register_fake, which the backend sees as one opaque op",
    ),
    (
        "GB0219",
        "return x.cos()",
        "backend='vendor' raised: NotImplementedError",
        TEMPLATES[("GB0219",)],
    ),
    # GB0039: a Python int driving a loop.
    (
        "GB0039",
        "for _ in range(n):",
        "",
        "pass n as a tensor and write the loop over range(n) as tensor math (each new value of "
        "a Python int in range() compiles a new graph)",
    ),
    # GB0123: backward() inside.
    (
        "GB0123",
        "loss.backward()",
        "",
        "call .backward() outside the compiled region: return the loss from the compiled "
        "function and call loss.backward() on the result",
    ),
    ("GB9186", "g, = torch.autograd.grad(loss, w)", "", TENSOR_METHOD),
    # GB0294: a numpy function with a torch equivalent, and one without.
    (
        "GB0294",
        "return torch.as_tensor(np.digitize(x.numpy(), bins))",
        "",
        "replace np.digitize with torch.bucketize(..., right=True) on the tensor itself (no "
        ".numpy() round trip)",
    ),
    (
        "GB0294",
        "return torch.as_tensor(np.nanmax(x.numpy()))",
        "",
        "np.nanmax cannot be traced: replace it with torch ops on the tensor itself",
    ),
    # GB0264/GB0206: a Parameter made in forward, requires_grad set.
    (
        "GB0264",
        "self.w = nn.Parameter(self.w * 0.9)",
        "",
        'self.w.copy_(self.w * 0.9), with self.register_buffer("w", ...) in __init__ instead of '
        "a Parameter",
    ),
    (
        "GB0206",
        "self.bias.requires_grad = False",
        "",
        "set self.bias.requires_grad = False once, outside the compiled call (or when you create "
        "it)",
    ),
]


@pytest.mark.parametrize(("gb_id", "line", "reason", "fix"), REWRITES)
def test_rewrites_of_the_users_line(gb_id: str, line: str, reason: str, fix: str) -> None:
    assert fix_for(gb_id, line, reason) == fix


def _first_rule(rules: Rules, line: str) -> int | None:
    """The index of the rule that rewrites ``line``, if one does."""
    matching = (i for i, (pattern, _) in enumerate(rules.rules) if pattern.search(code_of(line)))
    return next(matching, None)


def test_every_rewrite_rule_is_exercised() -> None:
    for fix in FIXES:
        cases = [(line, reason) for gb_id, line, reason, _ in REWRITES if gb_id in fix.gb_ids]
        if isinstance(fix.rewrite, Rules):
            exercised = {_first_rule(fix.rewrite, line) for line, _ in cases}
            assert exercised >= set(range(len(fix.rewrite.rules))), (fix.name, exercised)
        elif fix.rewrite is not None:
            # A rewriter function: a case it rewrites, and one it leaves to the template.
            texts = {fix.text(line, reason) for line, reason in cases}
            assert fix.template in texts, fix.name
            assert len(texts) > 1, fix.name
