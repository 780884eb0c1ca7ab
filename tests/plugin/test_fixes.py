"""Each fix of the table is tested: a tiny example of its break fails the marker with the fix in
its message, and the same example rewritten as the fix says passes the marker.

The examples are the patterns users hit most (measured on torch 2.13; the ids are Dynamo's).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from pytest_nobreak.fixes import FIXES, fix_for

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

@mark
def test_broken_print():
    run(printing, X)

@mark
def test_broken_logging():
    run(logging_, X)

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
    with LOCK:
        assert torch.equal(run(unlocked, X), X * 2 + 1)


# 7. a generator passed in (GB0811)
def doubled_sum(xs):
    return sum(t * 2 for t in xs)

@mark
def test_broken_generator():
    run(doubled_sum, (t for t in (X, X + 1)))

@mark
def test_fixed_generator():
    assert torch.allclose(run(doubled_sum, tuple(t for t in (X, X + 1))), X * 4 + 2)


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
    assert torch.equal(w.grad, 2 * X)


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
"""

#: test name -> (gb id of its break, the fix line its failure message shows).
BROKEN = {
    "branch": ("GB0170", "h = torch.where(t.mean() > 0.5, h * 0.5, h)"),
    "item": (
        "GB0124",
        "s = x.sum()  (a 0-d tensor: use it in tensor math, not as a Python number)",
    ),
    "tolist": ("GB0109", "x.sum() instead of sum(x.tolist())"),
    "print": (
        "GB0059",
        'move print("y =", y) to the caller, after the compiled call returns (or add print to '
        "torch._dynamo.config.reorderable_logging_functions)",
    ),
    "logging": ("GB0291", 'move log.info("step") out of the compiled region (log from the caller)'),
    "disabled": (
        "GB0098",
        "remove @torch.compiler.disable from disabled_helper (or call disabled_helper outside "
        "the compiled region); if it cannot be traced, fix what stops it instead",
    ),
    "c_function": (
        "GB0007",
        "compute pid = os.getpid() before the compiled call and pass pid in as an argument",
    ),
    "context_manager": (
        "GB0142",
        "move `with LOCK:` out of the compiled function: wrap the compiled call in it",
    ),
    "generator": ("GB0811", fix_for("GB0811", None)),
    "mask": ("GB0036", "torch.where(x > 0.5, x, 0).sum() instead of x[x > 0.5].sum()"),
    "backend": (
        "GB0219",
        "the backend cannot take aten._local_scalar_dense (a tensor's value read on the host, as "
        ".item() does): compute with the tensor instead (no .item()), or put the host call behind "
        "a torch.library.custom_op with a register_fake, which the backend sees as one opaque op",
    ),
    "recompiles": ("GB0039", fix_for("GB0039", None)),
    "shapes": ("GB0039", fix_for("GB0039", None)),
    "backward": (
        "GB0123",
        "call .backward() outside the compiled region: return the loss from the compiled "
        "function and call loss.backward() on the result",
    ),
    "numpy": (
        "GB0294",
        "replace np.nanmean with torch.nanmean on the tensor itself (no .numpy() round trip)",
    ),
    "setattr": (
        "GB0264",
        'self.running.copy_(0.9 * self.running + 0.1 * x), with self.register_buffer("running", '
        "...) in __init__ instead of a Parameter",
    ),
    "output": (
        "GB0059",
        "return y.max() from the compiled function and call str() on it in the caller",
    ),
    "repr": ("GB0569", fix_for("GB0569", None)),
}
FIXED = [
    "branch", "item", "tolist", "print", "disabled", "c_function", "context_manager",
    "generator", "mask", "backend", "recompiles", "shapes", "backward", "numpy", "setattr",
    "output",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One real pytest run of the examples: its output and its JSON report's tests."""

    returncode: int
    stdout: str
    tests: dict[str, Any]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    # One run of the 34 examples serves every test here (pytester is function-scoped).
    path = tmp_path_factory.mktemp("fixes")
    (path / "test_examples.py").write_text(EXAMPLES)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "no:xdist", "--nobreak-json", "r.json", "-rf", "test_examples.py"],
        cwd=path, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    report = json.loads((path / "r.json").read_text())
    return Outcome(proc.returncode, proc.stdout, report["tests"])


def test_every_fix_of_the_table_has_a_tested_example() -> None:
    tested = {gb_id for gb_id, _ in BROKEN.values()}
    for fix in FIXES:
        assert tested & set(fix.gb_ids), f"no example breaks with {fix.name} ({fix.gb_ids})"


def test_the_broken_examples_fail_and_the_fixed_ones_pass(outcome: Outcome) -> None:
    assert outcome.returncode == 1, outcome.stdout[-3000:]
    assert f"{len(BROKEN)} failed, {len(FIXED)} passed" in outcome.stdout.splitlines()[-1]
    failed = {
        line.split("::test_broken_")[1].split()[0]
        for line in outcome.stdout.splitlines()
        if line.startswith("FAILED test_examples.py::test_broken_")
    }
    assert failed == set(BROKEN)


@pytest.mark.parametrize("name", list(BROKEN))
def test_each_failure_names_its_break_and_its_fix(outcome: Outcome, name: str) -> None:
    gb_id, fix = BROKEN[name]
    entry = outcome.tests[f"test_examples.py::test_broken_{name}"]
    breaks = [b for b in entry["breaks"] if b["gb_id"] == gb_id]
    assert breaks, entry["breaks"]
    assert breaks[0]["fix"] == fix
    # The failure message shows the same fix under the break.
    assert f"fix: {fix}" in outcome.stdout


@pytest.mark.parametrize(
    ("gb_id", "line", "fix"),
    [
        # The tensor of .item() is never cut out of the call wrapping it.
        ("GB0124", "n = int(t.item())", "use t itself (a tensor) where t.item() is used"),
        (
            "GB0124",
            "return float(x.max().item())",
            "use x.max() itself (a tensor) where x.max().item() is used",
        ),
        # A one-line if is rewritten only when it is one plain assignment.
        ("GB0170", "if c: h = h * 2  # don't", fix_for("GB0170", None)),
        ("GB0170", "if c: h = 1; g = 2", fix_for("GB0170", None)),
        ("GB0170", "if c: y == z", fix_for("GB0170", None)),
        ("GB0170", "if c: h = h * 2  # halve", "h = torch.where(c, h * 2, h)"),
        # A C call is hoisted only when the line is just that call.
        ("GB0007", "y = model(x) + time.time()", fix_for("GB0007", None)),
        (
            "GB0007",
            "t0 = time.perf_counter()",
            "compute t0 = time.perf_counter() before the "
            "compiled call and pass t0 in as an argument",
        ),
    ],
)
def test_rewrites_leave_what_they_cannot_rewrite_to_the_pattern(
    gb_id: str, line: str, fix: str
) -> None:
    assert fix_for(gb_id, line) == fix
