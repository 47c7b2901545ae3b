"""promote start --metrics-port: the journal's rollout and nginx's own answers as Prometheus series, read at
each scrape from a real journal and a real-format nginx access log, over HTTP."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from faults import metric_value

from qlift.rollout.exporter import SERIES, serve_metrics
from qlift.rollout.journal import Journal


def _window(action: str) -> dict[str, object]:
    return {"started_at": "t0", "ended_at": "t1", "source": "nginx-access-log", "stable": {}, "canary": {},
            "action": action, "reason": "r", "checks": []}


def _line(pool: str, status: int, addrs: str, statuses: str) -> str:
    return json.dumps({"time": 1.0, "status": status, "pool": pool, "request_time": 0.1, "upstream_addr": addrs,
                       "upstream_status": statuses, "completion": "OK"}) + "\n"


def test_rollout_state_windows_and_nginx_5xx_are_scraped(tmp_path: Path) -> None:
    prefix = tmp_path / "nginx"
    (prefix / "logs").mkdir(parents=True)
    access = prefix / "logs" / "access.jsonl"
    # the canary's server fails once and nginx replays it on the stable; then nginx itself answers 502 once
    access.write_text(_line("stable", 200, "127.0.0.1:8001", "200")
                      + _line("canary", 200, "127.0.0.1:8002, 127.0.0.1:8001", "500, 200")
                      + _line("canary", 502, "127.0.0.1:8002", "502")
                      + '{"status": 200, "pool": "can')  # half written: counted once finished
    path = tmp_path / "journal.sqlite"
    spec = {"steps": [10, 50, 100], "interval": 20.0, "data_plane": "nginx", "nginx": {"prefix": str(prefix)}}
    server = serve_metrics(path, 0)  # before the journal exists: scrapes answer, empty
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        assert "qlift_rollout_info" not in httpx.get(url, timeout=10).text
        with Journal(path) as j:
            r = j.create(spec, "stable", "canary")
            j.change_weights(r.id, {"stable": 90, "canary": 10}, "step 0", lambda w: None)
            with j.tx() as db:
                for action in ("hold", "advance", "advance"):
                    j.add_window(db, r.id, 0, _window(action))
        text = httpx.get(url, timeout=10).text
        names = set(re.findall(r"^(qlift_\w+?)(?:_created)?[{ ]", text, re.M))
        assert names == set(SERIES)  # what the dashboards may name (tests/test_dashboard.py)
        assert metric_value(text, "qlift_rollout_info", stable="stable", canary="canary", state="progressing",
                            data_plane="nginx") == 1
        assert metric_value(text, "qlift_rollout_canary_weight") == 10
        assert metric_value(text, "qlift_rollout_interval_seconds") == 20
        assert metric_value(text, "qlift_rollout_windows_total", action="advance") == 2
        assert metric_value(text, "qlift_rollout_windows_total", action="hold") == 1
        assert metric_value(text, "qlift_nginx_responses_total", pool="canary", status_class="5xx") == 1
        assert metric_value(text, "qlift_nginx_responses_total", pool="canary", status_class="2xx") == 1
        assert metric_value(text, "qlift_nginx_upstream_responses_total", upstream="127.0.0.1:8002",
                            status_class="5xx") == 2
        with open(access, "a") as fh:
            fh.write('ary", "upstream_addr": "127.0.0.1:8002", "upstream_status": "200"}\n')
        text = httpx.get(url, timeout=10).text
        assert metric_value(text, "qlift_nginx_responses_total", pool="canary", status_class="2xx") == 2
        assert metric_value(text, "qlift_nginx_upstream_responses_total", upstream="127.0.0.1:8001") == 2
    finally:
        server.shutdown()
        server.server_close()
