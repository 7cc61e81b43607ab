"""Every query a dashboard runs, and Grafana's variable interpolation, for tests and lints.

Grafana's Prometheus datasource formats a variable as its plain value when it is single-valued;
a multi-value or All variable becomes a regex-escaped value, or `(a|b)` for several values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OPERATOR_PREFIXES = ("kvpilot_rollout_", "kvpilot_operator_")
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|{}\[\]])")
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a dashboard: where it sits and what it says."""

    dashboard: str
    where: str  # "panel 'Title' A" or "annotation 'Name'"
    expr: str
    legend: str = ""

    @property
    def reads_operator(self) -> bool:
        return any(prefix in self.expr for prefix in OPERATOR_PREFIXES)


def _panels(panels: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every panel target's and every Prometheus annotation's expression, in dashboard order."""
    uid = dashboard["uid"]
    found = [Query(uid, f"panel {panel['title']!r} {target['refId']}", target["expr"], target.get("legendFormat", ""))
             for panel in _panels(dashboard["panels"]) for target in panel.get("targets", [])]
    found += [Query(uid, f"annotation {annotation['name']!r}", annotation["expr"])
              for annotation in dashboard["annotations"]["list"] if "expr" in annotation]
    return found


def variables(dashboard: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in dashboard["templating"]["list"]}


def format_value(variable: Mapping[str, Any], selected: Sequence[str]) -> str:
    """A variable's selection as the Prometheus datasource writes it into a query."""
    if not variable.get("multi") and not variable.get("includeAll"):
        if len(selected) != 1:
            raise ValueError(f"variable {variable['name']!r} takes one value, got {list(selected)}")
        return selected[0]
    escaped = [_REGEX_SPECIAL.sub(r"\\\1", value) for value in selected]
    return escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"


def interpolate(expr: str, values: Mapping[str, str]) -> str:
    """Replace `$name` and `${name}`; an unknown variable is an error, not left in the query."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"query uses ${name}, which has no value (known: {sorted(values)}): {expr}")
        return values[name]

    return _VARIABLE.sub(replace, expr)
