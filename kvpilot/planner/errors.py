"""Errors the planner raises for inputs it cannot plan with."""

from __future__ import annotations


class PlannerError(ValueError):
    """An input the planner cannot use: the message names the field, the value and what is allowed."""
