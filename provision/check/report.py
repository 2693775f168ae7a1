"""bin/envcheck's report: one `Check` per named check, the `Report` of a run, its JSON (format 1).

Contract: a Check's status is PASS, WARN, FAIL or SKIP; a FAIL carries a fix a user can run; the
report is ok only when nothing FAILed. bin/train's preflight reads `Report` in-process and the JSON
report (REPORT_FORMAT) when it runs bin/envcheck.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
STATUSES = (PASS, WARN, FAIL, SKIP)
REPORT_FORMAT = 1  # bump when the JSON report's shape changes (bin/train's preflight reads it)


@dataclass
class Check:
    name: str
    status: str  # PASS | WARN | FAIL | SKIP
    seconds: float
    message: str
    fix: str = ""
    details: dict = field(default_factory=dict)


@dataclass
class Report:
    prefix: str
    env_name: str
    worker: bool
    fast: bool
    node: str
    started: str
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)
    only: list[str] = field(default_factory=list)  # --only: the rows asked for (and what they need ran)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.status == FAIL]

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r} in the report (checks: {', '.join(c.name for c in self.checks)})")

    def to_dict(self) -> dict:
        out = {"format": REPORT_FORMAT, **asdict(self)}
        out["ok"] = self.ok
        out["failed"] = self.failed
        out["counts"] = {s: sum(c.status == s for c in self.checks) for s in (PASS, WARN, FAIL, SKIP)}
        out["summary"] = self._summary(out["counts"])
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def summary(self) -> str:
        return self._summary({s: sum(c.status == s for c in self.checks) for s in (PASS, WARN, FAIL, SKIP)})

    def _summary(self, counts_by_status: dict[str, int]) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in counts_by_status.items() if n)
        where = f"{self.env_name} ({self.prefix}) on {self.node}"
        if self.ok:
            return f"envcheck: OK: {where}: {counts} in {self.seconds:.1f} s"
        return f"envcheck: FAILED {', '.join(self.failed)}: {where}: {counts} in {self.seconds:.1f} s"

    def render(self) -> str:
        width = max((len(c.name) for c in self.checks), default=10)
        lines = [
            f"envcheck {self.env_name} ({self.prefix}){' --worker' if self.worker else ''}"
            f"{' --fast' if self.fast else ''}{' --only ' + ','.join(self.only) if self.only else ''}"
            f" on {self.node}"
        ]
        for c in self.checks:
            body = c.message.replace("\n", "\n" + " " * (width + 15))
            lines.append(f"  {c.status:4}  {c.name:{width}}  {c.seconds:6.2f}s  {body}")
            if c.fix and c.status in (FAIL, WARN):
                lines.append(f"  {'':4}  {'':{width}}           fix: {c.fix}")
        lines.append(self.summary())
        return "\n".join(lines) + "\n"
