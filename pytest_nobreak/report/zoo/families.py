"""The zoo's counts per library and per family: how many architectures each has, how many
were built and run eagerly, compiled whole, and ran whole on the DUT within the int8 bound."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pytest_nobreak.models.families import FAMILIES

if TYPE_CHECKING:
    from pytest_nobreak.report.zoo.page import Row

__all__ = ["LIBRARIES", "family_table", "library_of"]

#: A SPEC's library by its prefix, in the order the table lists them.
LIBRARIES = {"hf": "transformers", "diffusers": "diffusers"}
#: The library of a factory SPEC (the user's own code).
FACTORIES = "factories"


def library_of(spec: str) -> str:
    prefix = spec.split(":", 1)[0]
    return LIBRARIES.get(prefix, FACTORIES)


def family_table(rows: Sequence[Row], families: Mapping[str, str]) -> list[str]:
    """A Markdown table: a line per library (bold), then one per family of it, each with its
    architectures, those built and run eagerly, whole, and whole and on the DUT."""
    groups: dict[str, dict[str, list[Row]]] = {}
    for row in rows:
        library = library_of(row.spec)
        family = families.get(row.spec, "")  # a report from before families: none
        groups.setdefault(library, {}).setdefault(family, []).append(row)
    order = [*LIBRARIES.values(), FACTORIES]
    lines = [
        "| library / family | architectures | built and run | compile whole "
        "| whole and on the DUT |",
        "|---|---:|---:|---:|---:|",
    ]
    for library in sorted(groups, key=order.index):
        members = [row for rows_ in groups[library].values() for row in rows_]
        lines.append(_counts(f"**{library}**", members))
        for family in sorted(groups[library], key=_family_rank):
            if family:
                lines.append(_counts(family, groups[library][family]))
    return lines


def _family_rank(family: str) -> tuple[int, str]:
    return (FAMILIES.index(family) if family in FAMILIES else len(FAMILIES), family)


def _counts(name: str, rows: Sequence[Row]) -> str:
    built = [row for row in rows if row.skipped is None]
    whole = [row for row in built if row.whole]
    on_dut = [row for row in built if row.on_dut]
    return f"| {name} | {len(rows)} | {len(built)} | {len(whole)} | {len(on_dut)} |"
