"""A fake Kubernetes API server for namespaced custom objects, spoken to by the real ``kubernetes``
client: the paths, verbs, JSON merge patch, Status bodies and codes (401, 404, 409, 415, 422) of
kube-apiserver, with each registered CRD's openAPIV3Schema checked on create and patch as the real
server checks structural schemas (CEL rules are left out, as qlift leaves them to the server); lists narrowed by a
labelSelector (EndpointSlices, which ``put`` stores as the cluster would).

    with FakeKube({("inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites"): schema}) as kube:
        kubeconfig = kube.kubeconfig(tmp_path)
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import yaml

TOKEN = "qlift-test-token"
_PATH = re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
                   r"(?:/(?P<name>[^/?]+))?/?(?:\?.*)?$")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeKube:
    """Serves ``schemas``' resources ((group, version, plural) -> openAPIV3Schema) on 127.0.0.1."""

    def __init__(self, schemas: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        self.schemas = schemas
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (group, plural, ns, name)
        self.requests: list[tuple[str, str, str]] = []  # (method, path, content type)
        self.lock = threading.Lock()
        self._rv = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeKube:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, directory: Path, *, token: str = TOKEN) -> Path:
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "qlift", "user": {"token": token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "qlift", "namespace": "default"}}],
        }), encoding="utf-8")
        return path

    def get(self, group: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.get((group, plural, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def put(self, group: str, plural: str, obj: dict[str, Any]) -> None:
        """Store ``obj`` as a controller would (an EndpointSlice the cluster keeps), replacing one of its name."""
        meta = obj["metadata"]
        with self.lock:
            key = (group, plural, meta["namespace"], meta["name"])
            self.objects[key] = self._stamp(copy.deepcopy(obj), self.objects.get(key))

    def delete(self, group: str, plural: str, namespace: str, name: str) -> None:
        with self.lock:
            self.objects.pop((group, plural, namespace, name), None)

    def _list(self, group: str, version: str, plural: str, ns: str, query: str) -> dict[str, Any]:
        """A namespaced list, narrowed by a labelSelector of ``key=value`` terms as kube-apiserver narrows it."""
        from urllib.parse import parse_qs

        selector = parse_qs(query).get("labelSelector", [""])[0]
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        items = [copy.deepcopy(o) for (g, p, n, _), o in sorted(self.objects.items())
                 if (g, p, n) == (group, plural, ns)
                 and all(o["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
        kind = items[0].get("kind", "") + "List" if items else "List"
        return {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {"resourceVersion": str(self._rv)},
                "items": items}

    def edit(self, group: str, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A hand edit (kubectl edit): merge ``patch`` into the stored object."""
        with self.lock:
            key = (group, plural, namespace, name)
            self.objects[key] = self._stamp(merge_patch(self.objects[key], patch), self.objects[key])

    def _stamp(self, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        self._rv += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self._rv)
        meta["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
        meta["creationTimestamp"] = old["metadata"]["creationTimestamp"] if old else "2026-01-01T00:00:00Z"
        gen = old["metadata"]["generation"] if old else 0
        meta["generation"] = gen + 1 if old is None or old.get("spec") != obj.get("spec") else gen
        return obj

    def _handle(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        self.requests.append((method, path, headers.get("Content-Type", "")))
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, status(401, "Unauthorized", "Unauthorized")
        m = _PATH.match(path.partition("?")[0])
        if not m or (m["group"], m["version"], m["plural"]) not in self.schemas:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        group, plural, ns, name = m["group"], m["plural"], m["ns"], m["name"]
        resource = f"{plural}.{group}"
        with self.lock:
            if method == "GET" and not name:
                return 200, self._list(group, m["version"], plural, ns, path.partition("?")[2])
            if method == "GET" and name:
                obj = self.objects.get((group, plural, ns, name))
                if obj is None:
                    return 404, status(404, "NotFound", f'{resource} "{name}" not found')
                return 200, obj
            if method == "POST" and not name:
                new = json.loads(body)
                name = new.get("metadata", {}).get("name", "")
                if (group, plural, ns, name) in self.objects:
                    return 409, status(409, "AlreadyExists", f'{resource} "{name}" already exists')
                if new.get("metadata", {}).get("namespace", ns) != ns:
                    return 400, status(400, "BadRequest", "the namespace of the object does not match the request")
                new.setdefault("metadata", {})["namespace"] = ns
                return self._store(m, new, None, 201)
            if method == "PATCH" and name:
                if headers.get("Content-Type") != "application/merge-patch+json":
                    kind = headers.get("Content-Type")
                    message = f"the body of the request was in an unknown format - {kind}"
                    return 415, status(415, "UnsupportedMediaType", message)
                old = self.objects.get((group, plural, ns, name))
                if old is None:
                    return 404, status(404, "NotFound", f'{resource} "{name}" not found')
                return self._store(m, merge_patch(old, json.loads(body)), old, 200)
        return 405, status(405, "MethodNotAllowed", f"{method} is not supported here")

    def _store(self, m: re.Match[str], obj: dict[str, Any], old: dict[str, Any] | None,
               code: int) -> tuple[int, dict[str, Any]]:
        schema = self.schemas[(m["group"], m["version"], m["plural"])]
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.path))
        if errors:
            where = ".".join(str(p) for p in errors[0].absolute_path)
            return 422, status(422, "Invalid", f"{where}: Invalid value: {errors[0].message}")
        if obj.get("apiVersion") != f"{m['group']}/{m['version']}":
            return 400, status(400, "BadRequest", f"apiVersion {obj.get('apiVersion')} does not match the request")
        obj = self._stamp(obj, old)
        self.objects[(m["group"], m["plural"], m["ns"], obj["metadata"]["name"])] = obj
        return code, obj

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                code, out = fake._handle(self.command, self.path, self.headers, body)
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
