"""A model hub on 127.0.0.1 that speaks the Hugging Face Hub and ModelScope HTTP APIs.

It answers the requests the real clients make (``huggingface_hub`` with ``endpoint=``,
``modelscope_hub`` with ``endpoint=``): repo info with file list, sizes, git blob ids and
LFS sha256; revision resolve; file resolve with ETag / X-Repo-Commit / Content-Length /
Range; ModelScope's repo/files listing (Sha256, Revision) and repo download. Repos are git-like:
commits hold full file sets and branches move. Faults can be injected per file
(corrupt a served body N times or always, stall mid-body) or for the whole hub (503).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")
LFS_MIN_SIZE = 10 * 1024 * 1024
BASE_TIME = 1_764_400_000


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(path: str, data: bytes) -> bool:
    return path.endswith(LFS_SUFFIXES) or len(data) >= LFS_MIN_SIZE


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]
    parent: str | None
    time: int


@dataclass
class Fault:
    corrupt: int | None = 0  # bodies still to corrupt; None = every time
    stall_after: int | None = None  # send this many bytes, then hold the connection
    delay_s: float = 0.0  # wait this long before sending the body
    release: threading.Event = field(default_factory=threading.Event)


@dataclass
class Request:
    method: str
    api: str  # "hf-info", "hf-file", "ms-files", "ms-file", ...
    path: str  # the repo file for file requests, else the URL path
    range: str | None
    auth: str | None
    cookie: str | None


@dataclass
class Repo:
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def resolve(self, rev: str) -> Commit | None:
        sha = self.refs.get(rev, rev)
        return self.commits.get(sha)

    def last_change(self, commit: Commit, path: str) -> Commit:
        """The commit that last changed ``path`` (ModelScope's per-file Revision)."""
        cur = commit
        while cur.parent is not None:
            parent = self.commits[cur.parent]
            if parent.files.get(path) != cur.files.get(path):
                break
            cur = parent
        return cur


class HubServer:
    """Start with ``with HubServer() as hub:``; ``hub.url`` is the endpoint for both clients."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.faults: dict[str, Fault] = {}
        self.requests: list[Request] = []
        self.sent: dict[str, int] = {}  # repo file -> body bytes sent, all requests together
        self.status_override: int | None = None
        self.published_size: dict[str, int] = {}  # lie about a file's size in listings
        self.after_listing: list[Callable[[], None]] = []  # run once, after the next repo listing
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for fault in self.faults.values():
            fault.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # --- building repos -------------------------------------------------------------
    def commit(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main") -> str:
        """Make ``files`` the full content of a new commit on ``branch``; returns its sha."""
        repo = self.repos.setdefault(repo_id, Repo())
        parent = repo.refs.get(branch)
        digest = hashlib.sha1(f"{repo_id}\0{parent}\0{len(repo.commits)}".encode())
        for path in sorted(files):
            digest.update(f"{path}\0{git_blob_id(files[path])}\n".encode())
        sha = digest.hexdigest()
        repo.commits[sha] = Commit(sha, dict(files), parent, BASE_TIME + 60 * len(repo.commits))
        repo.refs[branch] = sha
        return sha

    def tag(self, repo_id: str, name: str, sha: str) -> None:
        self.repos[repo_id].refs[name] = sha

    # --- what happened ----------------------------------------------------------------
    def file_gets(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.api in ("hf-file", "ms-file") and r.path == path]

    def wait_sent(self, path: str, nbytes: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.sent.get(path, 0) < nbytes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"hub sent {self.sent.get(path, 0)} of {nbytes} bytes of {path}")
            time.sleep(0.02)

    def log(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def take_corruption(self, path: str) -> bool:
        with self._lock:
            fault = self.faults.get(path)
            if fault is None or fault.corrupt == 0:
                return False
            if fault.corrupt is not None:
                fault.corrupt -= 1
            return True

    def run_after_listing(self) -> None:
        with self._lock:
            hooks, self.after_listing = self.after_listing, []
        for hook in hooks:
            hook()

    def count_sent(self, path: str, n: int) -> None:
        with self._lock:
            self.sent[path] = self.sent.get(path, 0) + n


def _handler_for(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # keep test output clean
            pass

        def do_HEAD(self) -> None:
            self._dispatch(body=False)

        def do_GET(self) -> None:
            self._dispatch(body=True)

        # --- routing -------------------------------------------------------------------
        def _dispatch(self, *, body: bool) -> None:
            url = urlsplit(self.path)
            parts = url.path.split("/")
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if hub.status_override is not None:
                hub.log(self._req("down", url.path))
                return self._json(hub.status_override, {"error": "hub unavailable"})
            if parts[1:3] == ["api", "models"] and len(parts) >= 7 and parts[5] == "tree":
                return self._hf_tree(f"{parts[3]}/{parts[4]}", unquote(parts[6]))
            if parts[1:3] == ["api", "models"] and len(parts) >= 7 and parts[5] == "revision":
                return self._hf_info(f"{parts[3]}/{parts[4]}", unquote("/".join(parts[6:])))
            if len(parts) >= 6 and parts[3] == "resolve":
                repo_id, rev = f"{parts[1]}/{parts[2]}", unquote(parts[4])
                return self._hf_file(repo_id, rev, unquote("/".join(parts[5:])), body=body)
            if parts[1:4] == ["api", "v1", "models"] and len(parts) >= 7:
                repo_id, rest = f"{parts[4]}/{parts[5]}", parts[6:]
                if rest == ["repo", "files"]:
                    return self._ms_files(repo_id, query)
                if rest == ["repo"]:
                    return self._ms_file(repo_id, query, body=body)
                if rest == ["revisions"]:
                    return self._ms_revisions(repo_id)
            hub.log(self._req("other", url.path))
            self._json(404, {"Code": 404, "Message": f"no route {url.path}", "Success": False})

        # --- Hugging Face ----------------------------------------------------------------
        def _hf_commit(self, repo_id: str, rev: str):  # type: ignore[no-untyped-def]
            """The commit ``rev`` names in ``repo_id``, or None after answering the Hub's error."""
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._hf_error(401, "RepoNotFound", "Repository not found")
                return None
            commit = repo.resolve(rev)
            if commit is None:
                self._hf_error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return commit

        def _hf_info(self, repo_id: str, rev: str) -> None:
            hub.log(self._req("hf-info", f"{repo_id}@{rev}"))
            commit = self._hf_commit(repo_id, rev)
            if commit is None:
                return None
            siblings = []
            for path in sorted(commit.files):
                data = commit.files[path]
                size = hub.published_size.get(path, len(data))
                sib: dict[str, object] = {"rfilename": path, "size": size, "blobId": git_blob_id(data)}
                if is_lfs(path, data):
                    sha = hashlib.sha256(data).hexdigest()
                    sib["lfs"] = {"size": size, "sha256": sha, "pointerSize": 134}
                    sib["blobId"] = git_blob_id(_lfs_pointer(sha, len(data)))
                siblings.append(sib)
            hub.run_after_listing()
            self._json(200, {
                "_id": commit.sha[:24], "id": repo_id, "modelId": repo_id, "sha": commit.sha,
                "private": False, "disabled": False, "gated": False, "downloads": 0, "likes": 0,
                "tags": [], "siblings": siblings,
                "lastModified": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(commit.time)),
            })

        def _hf_tree(self, repo_id: str, rev: str) -> None:
            """The recursive tree listing snapshot_download uses (one page, no Link header)."""
            hub.log(self._req("hf-tree", f"{repo_id}@{rev}"))
            commit = self._hf_commit(repo_id, rev)
            if commit is None:
                return None
            entries: list[dict[str, object]] = []
            dirs = sorted({"/".join(p.split("/")[:i]) for p in commit.files for i in range(1, p.count("/") + 1)})
            entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in dirs]
            for path in sorted(commit.files):
                data = commit.files[path]
                entry: dict[str, object] = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
                if is_lfs(path, data):
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                entries.append(entry)
            self._json(200, entries)

        def _hf_file(self, repo_id: str, rev: str, path: str, *, body: bool) -> None:
            hub.log(self._req("hf-file", path))
            commit = self._hf_commit(repo_id, rev)
            if commit is None:
                return None
            data = commit.files.get(path)
            if data is None:
                return self._hf_error(404, "EntryNotFound", f"{path} does not exist", commit.sha)
            etag = hashlib.sha256(data).hexdigest() if is_lfs(path, data) else git_blob_id(data)
            self._send_file(path, data, {"ETag": f'"{etag}"', "X-Repo-Commit": commit.sha}, body=body)

        def _hf_error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message}
            if commit:
                headers["X-Repo-Commit"] = commit
            self._json(status, {"error": message}, headers)

        # --- ModelScope ------------------------------------------------------------------
        def _ms_files(self, repo_id: str, query: dict[str, str]) -> None:
            hub.log(self._req("ms-files", repo_id))
            repo = hub.repos.get(repo_id)
            commit = repo.resolve(query.get("Revision", "master")) if repo else None
            if repo is None or commit is None:
                return self._json(404, {"Code": 10010205001, "Message": f"{repo_id} not found", "Success": False})
            files = []
            for path in sorted(commit.files):
                data = commit.files[path]
                changed = repo.last_change(commit, path)
                files.append({
                    "Name": path.rsplit("/", 1)[-1], "Path": path, "Type": "blob",
                    "Size": hub.published_size.get(path, len(data)),
                    "Sha256": hashlib.sha256(data).hexdigest(), "Revision": changed.sha,
                    "CommittedDate": changed.time, "IsLFS": is_lfs(path, data), "Mode": "33188",
                })
            hub.run_after_listing()
            self._json(200, {"Code": 200, "Success": True, "Message": "success", "Data": {
                "Files": files, "TotalCount": len(files), "IsVisual": 0,
                "LatestCommitter": {"Id": commit.sha, "ShortId": commit.sha[:8]},
            }})

        def _ms_file(self, repo_id: str, query: dict[str, str], *, body: bool) -> None:
            path = query.get("FilePath", "")
            hub.log(self._req("ms-file", path))
            repo = hub.repos.get(repo_id)
            commit = repo.resolve(query.get("Revision", "master")) if repo else None
            data = commit.files.get(path) if commit else None
            if data is None:
                return self._json(404, {"Code": 10010205001, "Message": f"{path} not found", "Success": False})
            self._send_file(path, data, {}, body=body)

        def _ms_revisions(self, repo_id: str) -> None:
            hub.log(self._req("ms-revisions", repo_id))
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._json(404, {"Code": 10010205001, "Message": "not found", "Success": False})
            branches = [{"Revision": name, "CreatedAt": repo.commits[sha].time} for name, sha in repo.refs.items()]
            self._json(200, {"Code": 200, "Success": True, "Data": {"RevisionMap": {"Branches": branches, "Tags": []}}})

        # --- bodies ----------------------------------------------------------------------
        def _send_file(self, path: str, data: bytes, headers: dict[str, str], *, body: bool) -> None:
            start, end = 0, len(data) - 1
            status = 200
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes=") and data:
                first, _, last = rng[len("bytes="):].partition("-")
                start = int(first)
                end = min(int(last), len(data) - 1) if last else len(data) - 1
                if start >= len(data):
                    unsatisfiable = {"Content-Range": f"bytes */{len(data)}"}
                    return self._json(416, {"error": "range not satisfiable"}, unsatisfiable)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            chunk = data[start:end + 1]
            if body and hub.take_corruption(path) and chunk:
                mid = len(chunk) // 2
                chunk = chunk[:mid] + bytes([chunk[mid] ^ 0xFF]) + chunk[mid + 1:]
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(chunk)))
            self.end_headers()
            if not body:
                return
            fault = hub.faults.get(path)
            if fault is not None and fault.delay_s:
                time.sleep(fault.delay_s)
            if fault is not None and fault.stall_after is not None:
                head = chunk[: fault.stall_after]
                self._write(path, head)
                fault.release.wait(60)
                self.close_connection = True
                return
            self._write(path, chunk)

        def _write(self, path: str, data: bytes) -> None:
            view = memoryview(data)
            for i in range(0, len(view), 256 * 1024):
                try:
                    self.wfile.write(view[i:i + 256 * 1024])
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                    return
                hub.count_sent(path, len(view[i:i + 256 * 1024]))

        def _json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

        def _req(self, api: str, path: str) -> Request:
            return Request(self.command, api, path, self.headers.get("Range"),
                           self.headers.get("Authorization"), self.headers.get("Cookie"))

    return Handler


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
