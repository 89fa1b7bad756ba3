"""User-facing errors: one line naming the field and what is allowed, exit code 2."""
from __future__ import annotations

from typing import Iterable


class MoeBuildError(Exception):
    """A problem with the user's input; the CLI prints it on one line and exits with `exit_code`."""

    exit_code = 2

    def __init__(self, field: str, problem: str, allowed: Iterable[object] | str | None = None):
        self.field = field
        self.problem = problem
        if allowed is None or isinstance(allowed, str):
            self.allowed = allowed
        else:
            self.allowed = ", ".join(str(a) for a in allowed)
        text = f"{field}: {problem}"
        if self.allowed:
            text += f" (allowed: {self.allowed})"
        super().__init__(text)


class UnsupportedCombination(MoeBuildError):
    """The planner refused the spec/target pair; `rule` names the gate that refused it."""

    def __init__(self, field: str, problem: str, rule: str, source: str):
        self.rule = rule
        self.source = source
        super().__init__(field, f"{problem} [rule {rule}, {source}]")


class VerificationError(Exception):
    """An engine and its manifest/plan disagree, or a file was tampered with (exit 1)."""

    exit_code = 1
