"""The line `make test` ends with when real-component suites were skipped (nginx, Prometheus missing).

A machine without them skips those tests quietly among hundreds of passes; this names them, and
the command that enables them, as the session's last line (hooked in conftest.py).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

COMPONENTS = {"nginx": "nginx", "prometheus": "Prometheus", "promtool": "Prometheus"}
ENABLE = ("sudo apt-get install -y --no-install-recommends nginx prometheus (or `make setup` as root / with "
          "passwordless sudo)")


def skip_reason(report: Any) -> str:
    longrepr = getattr(report, "longrepr", None)
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr or "")


def summary_line(skipped: Iterable[Any]) -> str | None:
    """'real-component suites skipped: nginx (2 tests in test_a.py), ...; enable them with: ...', or None."""
    files: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for report in skipped:
        found = re.search(r"\b(nginx|prometheus|promtool)\b", skip_reason(report), re.I)
        if found:
            component = COMPONENTS[found.group(1).lower()]
            files[component][str(report.nodeid).split("::")[0]] += 1
    if not files:
        return None
    parts = []
    for component, per_file in sorted(files.items()):
        total = sum(per_file.values())
        where = ", ".join(f"{path.removeprefix('tests/')}" for path in sorted(per_file))
        parts.append(f"{component} ({total} test{'s' if total != 1 else ''} in {where})")
    return f"real-component suites skipped: {'; '.join(parts)}. Enable them with: {ENABLE}"
