"""Router settings: a YAML file (``--config``) validated here, with command-line flags on top."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from qlift.errors import BadInputError, NotFoundError
from qlift.loaders import parse_yaml

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DOCS = "See docs/router.md for the settings."


class _Strict(BaseModel):
    # A timeout of inf or nan passes ``gt=0`` and would disable the limit it sets: every number must be finite.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class BackendConfig(_Strict):
    name: str = Field(description="Short name used in weights, metrics and logs (stable, canary).")
    url: str = Field(description="Base URL of an OpenAI-compatible server (a vLLM), without /v1.")
    served_model: str | None = Field(default=None, description="Its model name (URL#MODEL also sets it); checked to "
                                     "be listed in its /v1/models; the first id listed there if unset.")
    weight: int | None = Field(default=None, ge=0, le=100, description="Percent of new traffic.")
    model_hash: str | None = Field(default=None, description="The served version's ModelRef content hash, as "
                                   "`qlift serve` records it (model_ref.content_hash); shown by /admin/state.")

    @model_validator(mode="before")
    @classmethod
    def _url_model(cls, data: Any) -> Any:
        """``url: http://host:port#MODEL``: a version is a server plus a model name."""
        if isinstance(data, dict) and isinstance(data.get("url"), str) and "#" in data["url"]:
            url, model = split_url_model(data["url"])
            data = {**data, "url": url}
            if model and not data.get("served_model"):
                data["served_model"] = model
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"backend name {v!r} must be letters, digits, '.', '_' or '-'")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        problem = url_problem(v)
        if problem:
            raise ValueError(f"backend url {redact_url(v)!r} {problem}")
        return v.rstrip("/").removesuffix("/v1")


HASH_IN_PASSWORD = ("has a '#' in its user or password; write it as %23 there (a '#' after the URL names the "
                    "model)")


def split_url_model(text: str) -> tuple[str, str]:
    """``URL#MODEL`` -> (URL, MODEL). A '#' inside the credentials (``http://u:pa#ss@host``) is refused:
    it would cut the password, and the rest would be taken for a model name and printed."""
    url, _, model = text.partition("#")
    if "@" in model.split("/", 1)[0]:
        raise ValueError(f"backend url {redact_url(text)!r} {HASH_IN_PASSWORD}")
    return url, model


def url_problem(url: str) -> str | None:
    """What is wrong with a backend URL (None = nothing): http(s), a host, a valid port, no spaces."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "has a space or a control character in it"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # its text may quote a piece of a password: not shown
        return ("is not a valid URL (a port that is not a number, or a '/', '?' or '#' in a password: write those "
                "as %2F, %3F, %23)")
    if parts.netloc.count("@") > 1:
        return "has more than one '@' before its host; write an '@' in a user or password as %40"
    if parts.scheme not in ("http", "https") or not url.lower().startswith(("http://", "https://")):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "has no host"
    if port == 0:
        return "has port 0"
    if parts.query or parts.fragment:
        return "must not have a query or fragment (the model goes after '#' only in --backend NAME=URL#MODEL)"
    return None


def redact_url(url: str) -> str:
    """``url`` (or any text with URLs in it) with each user:password@ part shown as ``***@``: credentials
    never reach a log or a screen. Up to the URL's last '@', so a password with '/', '#' or '@' in it
    is hidden whole (more is hidden rather than less)."""
    return re.sub(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^\s'\"]*@", r"\1***@", url)


class LimitsConfig(_Strict):
    requests_per_s: float | None = Field(default=None, gt=0, description="Per-key request rate (token bucket refill).")
    burst: int | None = Field(default=None, ge=1, description="Requests a key may send at once (default max(1, rate)).")
    tokens_per_min: int | None = Field(default=None, ge=1, description="Per-key prompt + completion tokens per minute.")


STREAM_FIRST_BYTE_S = 60.0  # a stream's first event when timeouts.first_byte_s is unset


class TimeoutsConfig(_Strict):
    connect_s: float = Field(default=5.0, gt=0, description="Connecting to a backend.")
    first_byte_s: float | None = Field(default=None, gt=0, description="Request sent -> a stream's first event, or a "
                                       "whole non-streamed answer. Unset: 60 s for streams; non-streamed answers, "
                                       "which arrive whole, get request_s.")
    idle_s: float = Field(default=30.0, gt=0, description="Longest silence between two chunks of a stream.")
    request_s: float = Field(default=600.0, gt=0, description="Deadline for a whole request, replays and stream "
                             "included: a backend that never finishes (SSE comments forever) cannot hold a client.")
    keepalive_s: float = Field(default=4.0, gt=0, description="How long an idle pooled connection is reused; keep it "
                               "below the backend's own keep-alive (vLLM closes idle connections after 5 s).")

    def first_byte_for(self, stream: bool) -> float:
        """The wait for a stream's first event, or for a whole non-streamed answer."""
        return self.first_byte_s or (STREAM_FIRST_BYTE_S if stream else self.request_s)


class ServerConfig(_Strict):
    """Limits on the clients' side of the router (what keeps slow or abusive clients from exhausting it)."""

    max_connections: int = Field(default=2048, ge=1, description="Open client connections at most; more get 503 "
                                 "(lowered to what the open-files limit allows).")
    header_timeout_s: float = Field(default=10.0, gt=0, description="A request's headers must arrive within this "
                                    "(from connect, or from the first byte of a later request on a kept-alive "
                                    "connection); else 408 and closed.")
    body_timeout_s: float = Field(default=30.0, gt=0, description="A request's body must arrive within this; else "
                                  "408.")
    keepalive_s: float = Field(default=75.0, gt=0, description="An idle client connection is closed after this.")
    log_interval_s: float = Field(default=60.0, gt=0, description="Each distinct connection-level error (malformed "
                                  "request, too many open files, ...) is logged once per interval, with a count.")


class HealthConfig(_Strict):
    interval_s: float = Field(default=2.0, gt=0, description="Seconds between active /health checks of each backend.")
    timeout_s: float = Field(default=2.0, gt=0, description="A check slower than this fails.")
    failures: int = Field(default=2, ge=1, description="Consecutive failed checks that take a backend out of rotation.")


class RouterConfig(_Strict):
    backends: list[BackendConfig] = Field(default_factory=list)
    public_model: str | None = Field(default=None, description="The model name clients send (default: the first "
                                     "backend's model, once it lists it).")
    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to listen on; 0 picks a free one.")
    api_keys_file: Path | None = Field(default=None, description="Keys or sha256:HEX hashes, one a line; none = open.")
    filter_file: Path | None = Field(default=None, description="Blocked words / re:PATTERN lines; reloaded on change.")
    filter_answers: bool = Field(default=True, description="Check answers with the filter_file too (chat and "
                                 "completions): cut before a blocked word, finish_reason content_filter. Off: "
                                 "prompts only.")
    metrics_token_file: Path | None = Field(default=None, description="A file holding a token that may read /metrics "
                                            "(besides the admin token): what Prometheus's credentials_file points "
                                            "at. /metrics needs one of them once API keys, the admin token or this "
                                            "is set.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    max_request_bytes: int = Field(default=1 << 20, ge=1024, description="Larger request bodies get 413.")
    access_log: str = Field(default="-", description="File for JSON access lines; '-' = stderr, '' = off.")
    drain_s: float = Field(default=30.0, ge=0, description="On SIGTERM, time in-flight requests get to finish.")
    state_file: Path | None = Field(default=None, description="Keep admin-set weights and shadow settings here across "
                                    "restarts (default: <config>.state.json beside --config; none without --config).")
    failover_to_zero_weight: bool = Field(default=False, description="When every backend with weight is down or "
                                          "failed, send users to a healthy backend whose weight is 0 in this file, "
                                          "instead of the failure or a 503. Never one the admin API set to 0 (a "
                                          "rollout's shadow phase or rollback) nor the shadow version. Off: weight 0 "
                                          "means no user traffic, ever.")
    rewrite_model: bool = Field(default=True, description="Answers name the public model (off: the backend's own "
                                "name, for debugging).")
    expose_backend_header: bool = Field(default=False, description="Send X-Qlift-Backend (the backend that "
                                        "answered) to every caller; off: only to callers presenting the admin token, "
                                        "so a client never learns which version answered.")
    answer_sample: int = Field(default=100, ge=0, le=100, description="Percent of chat and completion answers whose "
                               "text the admin request log keeps (capped, newest first) for a rollout's answer "
                               "checks (loops, language, refusals, schemas); 0 = none.")

    @model_validator(mode="after")
    def _backends(self) -> RouterConfig:
        names = [b.name for b in self.backends]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"backend names must be unique; repeated: {', '.join(sorted(dup))}")
        return self

    def weights(self) -> dict[str, int]:
        """Each backend's weight; unset weights share what is left (the first takes the remainder)."""
        given = {b.name: b.weight for b in self.backends if b.weight is not None}
        rest = [b.name for b in self.backends if b.weight is None]
        left = 100 - sum(given.values())
        out = dict(given)
        if rest:
            share, extra = divmod(max(left, 0), len(rest))
            for i, name in enumerate(rest):
                out[name] = share + (extra if i == 0 else 0)
        return {b.name: out[b.name] for b in self.backends}


def check_weights(weights: dict[str, Any], known: list[str]) -> dict[str, int]:
    """Weights naming known backends, ints 0..100 summing to 100; raises ValueError naming the problem.

    Backends left out get 0.
    """
    if not isinstance(weights, dict) or not weights:
        raise ValueError('weights must be a JSON object like {"stable": 90, "canary": 10}')
    unknown = [n for n in weights if n not in known]
    if unknown:
        raise ValueError(f"unknown backend {unknown[0]!r}; known: {', '.join(known)}")
    for name, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= 100:
            raise ValueError(f"weight of {name!r} must be an integer 0..100, got {w!r}")
    total = sum(weights.values())
    if total != 100:
        raise ValueError(f"weights must sum to 100, got {total}")
    return {n: int(weights.get(n, 0)) for n in known}


def parse_config(data: Any, *, path: Path | str) -> RouterConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInputError("a router config must be a YAML mapping", path=path, hint=DOCS)
    try:
        return RouterConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise BadInputError(msg, path=path, field=field, hint=DOCS) from None


def load_config(path: Path) -> RouterConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFoundError(f"router config {path} does not exist", hint="Check the --config path.") from None
    except UnicodeDecodeError as exc:
        raise BadInputError(f"not UTF-8 text (byte {exc.start})", path=path,
                            hint="Save the router config as UTF-8.") from None
    except OSError as exc:
        raise BadInputError(f"cannot read the router config: {exc.strerror or exc}", path=path,
                            hint="Pass a readable YAML file to --config.") from None
    return parse_config(parse_yaml(text, path=path, hint="Fix the YAML syntax."), path=path)


def parse_backend_flag(text: str) -> dict[str, Any]:
    """``NAME=URL[#MODEL]`` (or the older ``NAME=URL@MODEL``) -> backend fields."""
    name, sep, rest = text.partition("=")  # the first '=': a URL may hold more (query strings, passwords)
    if not sep or not name or not rest:
        raise BadInputError(f"--backend {redact_url(text)!r} is not NAME=URL[#MODEL]", field="--backend",
                            hint="Example: --backend stable=http://127.0.0.1:8001#smollm2")
    try:
        url, served = split_url_model(rest)
    except ValueError as exc:
        raise BadInputError(str(exc), field="--backend", hint="Example: --backend "
                            "stable=http://user:pa%23ss@127.0.0.1:8001#smollm2") from None
    if not served and "@" in url:
        # URL@MODEL only where the part before the last '@' is a whole URL with a port
        # (http://127.0.0.1:8001@smollm2, http://u:pw@127.0.0.1:8001@smollm2); in http://user:pw@host:8001
        # the '@' ends the credentials.
        before, _, after = url.rpartition("@")
        if after and not any(c in after for c in ":/") and _has_port(before):
            url, served = before, after
    return {"name": name, "url": url, "served_model": served or None}


def _has_port(url: str) -> bool:
    try:
        return urlsplit(url).port is not None
    except ValueError:
        return False


def parse_weight_flag(text: str) -> tuple[str, int]:
    name, sep, pct = text.partition("=")
    try:
        value = int(pct)
    except ValueError:
        value = -1
    if not sep or not name or not 0 <= value <= 100:
        raise BadInputError(f"--weight {text!r} is not NAME=PCT with PCT an integer 0..100", field="--weight",
                            hint="Example: --weight stable=90 --weight canary=10")
    return name, value


# RouterConfig's fields that `qlift router` takes as flags (the rest live in --config).
FLAG_FIELDS = ("public_model", "host", "port", "state_file", "filter_file", "filter_answers")


def build_config(*, config_path: Path | None, backends: list[str], weights: list[str],
                 flags: dict[str, Any] | None = None) -> RouterConfig:
    """The file's settings (if any) with the flags on top (``flags``: FLAG_FIELDS, None = not given);
    weights checked to name backends and sum to 100."""
    overrides = {k: v for k, v in (flags or {}).items() if v is not None and v != ""}
    data: dict[str, Any] = {}
    where: Path | str = "command line"
    if config_path is not None:
        data = load_config(config_path).model_dump(exclude_unset=True, mode="json")
        where = config_path
        for key in ("api_keys_file", "filter_file", "metrics_token_file"):  # relative to the config file
            if data.get(key):
                data[key] = str(config_path.parent / data[key])
        if data.get("access_log") not in (None, "", "-"):
            data["access_log"] = str(config_path.parent / data["access_log"])
        data.setdefault("state_file", config_path.with_suffix(".state.json").name)
        if data.get("state_file"):
            data["state_file"] = str(config_path.parent / data["state_file"])
    if backends:
        data["backends"] = [parse_backend_flag(b) for b in backends]
    data.update({k: str(v) if isinstance(v, Path) else v for k, v in overrides.items()})
    cfg = parse_config(data, path=where)
    if not cfg.backends:
        raise BadInputError("no backend given", path=config_path, field="backends" if config_path else None,
                            hint="Pass --backend NAME=URL (repeatable) or list backends in --config.")
    known = [b.name for b in cfg.backends]
    for text in weights:
        name, value = parse_weight_flag(text)
        if name not in known:
            raise BadInputError(f"--weight names unknown backend {name!r}; known: {', '.join(known)}",
                                field="--weight", hint="Use a NAME given with --backend.")
        next(b for b in cfg.backends if b.name == name).weight = value
    given = [b.weight for b in cfg.backends if b.weight is not None]
    if given and (sum(given) > 100 or (len(given) == len(cfg.backends) and sum(given) != 100)):
        raise BadInputError(f"backend weights sum to {sum(given)}, not 100", path=None if weights else config_path,
                            field="--weight" if weights else "backends.weight",
                            hint="Make the weights add up to 100.")
    return cfg
