"""Fixtures for the plugin's pytester tests: a models module with one function per scenario."""

from __future__ import annotations

from typing import Any

import pytest

MODELS = '''
import torch
from torch import nn
from torch._dynamo.backends.common import aot_autograd


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))  # LINE:mlp


def data_dependent(x):
    x = x * 2
    if x.sum() > 0:  # LINE:branch
        return x + 1
    return x - 1


def prints(x):
    x = x * 2
    print("debug")  # LINE:print
    return x + 1


def item(x):
    return x * x.sum().item()  # LINE:item


@torch.compiler.disable
def host_helper(x):
    return x.cos()


def calls_disabled(x):
    return host_helper(x * 2) + 1  # LINE:disabled


class Inner(nn.Module):
    def forward(self, x):
        return x.cos() if x.max() > 0 else x.sin()  # LINE:nested


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), Inner())

    def forward(self, x):
        return self.block(x) * 2


def two_breaks(x):
    x = x * 2
    print("first")  # LINE:two_a
    x = x + 1
    return x * x.sum().item()  # LINE:two_b


def loop(x):
    for i in range(2):
        x = x + 1
        print("iter", i)  # LINE:loop
    return x


def clean(x):  # LINE:clean
    return torch.relu(x) + 1


def dut_matmul_sync(a, w, b):
    scale = int(a.abs().max().item() * 127) or 1
    return (a * scale).round() @ w.t() / scale + b


def naive_backend(gm, example_inputs):
    """The seed: swap linear for a Python function that reads scalars, then aot_autograd."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch._C._nn.linear:
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(dut_matmul_sync, args=tuple(node.args))
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
    gm.recompile()
    return aot_autograd(fw_compiler=lambda g, ex: g)(gm, example_inputs)


class Seed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)

    def forward(self, x):
        return torch.relu(self.fc1(x))  # LINE:seed
'''


class Models:
    """A pytester directory holding ``models.py``, and the line numbers of its tagged lines."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        self.path = pytester.makepyfile(models=MODELS)
        pytester.syspathinsert()

    def line(self, tag: str) -> int:
        """The line number of ``# LINE:tag`` in the written models.py."""
        for number, text in enumerate(self.path.read_text().splitlines(), start=1):
            if text.rstrip().endswith(f"# LINE:{tag}"):
                return number
        raise KeyError(tag)

    def where(self, tag: str) -> str:
        return f"models.py:{self.line(tag)}"


@pytest.fixture
def models(pytester: pytest.Pytester) -> Models:
    return Models(pytester)


#: What a JSON break carries for the HTML report only (the lines around the user's line, its
#: source, Dynamo's hints and docs link): tests of the gating figures compare the rest.
HTML_ONLY_KEYS = ("source", "hints", "link", "context")


def without_html_details(entry: dict[str, Any]) -> dict[str, Any]:
    """A JSON report's test entry with its breaks' HTML-only keys left out."""
    breaks = []
    for event in entry["breaks"]:
        event = {k: v for k, v in event.items() if k not in HTML_ONLY_KEYS}
        if "call_sites" in event:
            event["call_sites"] = [
                {k: v for k, v in site.items() if k != "source"} for site in event["call_sites"]
            ]
        breaks.append(event)
    return {**entry, "breaks": breaks}
