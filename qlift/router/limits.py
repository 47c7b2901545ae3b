"""API keys and per-key token buckets (requests/s and tokens/min)."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qlift.errors import BadInputError, NotFoundError

ANONYMOUS = "anonymous"


def key_id(key: str) -> str:
    """What logs and metrics show for a key: never the key itself."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


@dataclass
class ApiKeys:
    """Accepted keys by sha256 hex digest -> key id. Empty means the router is open."""

    digests: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> ApiKeys:
        """One key a line: ``KEY`` or ``sha256:HEX``, optionally followed by an id; ``#`` comments."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise NotFoundError(f"API keys file {path} does not exist", hint="Check api_keys_file.") from None
        except UnicodeDecodeError as exc:
            raise BadInputError(f"not UTF-8 text (byte {exc.start})", path=path,
                                hint="Save the API keys file as UTF-8, one key a line.") from None
        except OSError as exc:
            raise BadInputError(f"cannot read the API keys file: {exc.strerror or exc}", path=path,
                                hint="Point api_keys_file at a readable file, one key a line.") from None
        digests: dict[str, str] = {}
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()  # a key is stripped of surrounding whitespace, as a presented one is
            if not line:
                continue
            secret, _, name = line.replace("\t", " ").partition(" ")
            if secret.startswith("sha256:"):
                digest = secret.removeprefix("sha256:").lower()
                if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                    raise BadInputError("sha256: must be followed by 64 hex digits", path=path, line=lineno,
                                        hint="Write `sha256:$(printf %s KEY | sha256sum)`.")
            else:
                digest = hashlib.sha256(secret.encode()).hexdigest()
            digests[digest] = name.strip() or "key-" + digest[:8]
        return cls(digests)

    @property
    def open(self) -> bool:
        return not self.digests

    def identify(self, key: str | None) -> str | None:
        """The key's id, ANONYMOUS when the router is open, None for an unknown key."""
        if self.open:
            return ANONYMOUS
        if not key:
            return None
        digest = hashlib.sha256(key.encode()).hexdigest()
        for known, name in self.digests.items():
            if hmac.compare_digest(known, digest):
                return name
        return None


def read_token_file(path: Path, what: str) -> str:
    """A token kept in a file (its one line, stripped of surrounding whitespace); BadInputError naming the file."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        problem = f"not UTF-8 (byte {exc.start})" if isinstance(exc, UnicodeDecodeError) else \
            f"cannot read it: {exc.strerror or exc}"
        raise BadInputError(f"{what} {problem}", path=path, hint=f"Point {what} at a readable file with one token.") \
            from None
    if not token or "\n" in token:
        raise BadInputError(f"{what} must hold one token on one line", path=path,
                            hint="Write the token alone in the file.")
    return token


def bearer_token(header: str | None) -> str | None:
    """The credentials of ``Authorization: Bearer <token>``: the scheme case-insensitive (RFC 7235),
    the token stripped of surrounding whitespace; None for a missing header, another scheme,
    a bare token without a scheme, or an empty token."""
    parts = (header or "").split(None, 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return parts[1].strip() or None


class TokenBucket:
    """``capacity`` tokens, refilled at ``rate`` per second. The balance may go negative (debt)."""

    def __init__(self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = capacity
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def wait_for(self, amount: float = 1.0) -> float:
        """Seconds until ``amount`` tokens are there (0 = now)."""
        self._refill()
        missing = amount - self._tokens
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, amount: float = 1.0) -> float:
        """Take ``amount`` if there; else take nothing and return the seconds to wait."""
        wait = self.wait_for(amount)
        if wait == 0:
            self._tokens -= amount
        return wait

    def charge(self, amount: float) -> None:
        """Debit after the fact (tokens used), going into debt if needed; a negative amount refunds."""
        self._refill()
        self._tokens = min(self.capacity, self._tokens - amount)


@dataclass
class Rejection:
    reason: str  # rate_requests, rate_tokens
    retry_after_s: float
    message: str


class KeyLimits:
    """One requests/s bucket and one tokens/min bucket per key id, created on first use."""

    def __init__(self, requests_per_s: float | None, burst: int | None, tokens_per_min: int | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.requests_per_s = requests_per_s
        self.burst = burst or (max(1, int(requests_per_s)) if requests_per_s else 1)
        self.tokens_per_min = tokens_per_min
        self._clock = clock
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}

    def admit(self, key: str) -> Rejection | None:
        """Count one request against ``key``; a Rejection says why not and for how long."""
        if self.tokens_per_min:
            bucket = self._tokens.setdefault(key, TokenBucket(self.tokens_per_min / 60.0, self.tokens_per_min,
                                                              self._clock))
            wait = bucket.wait_for(1)
            if wait > 0:
                return Rejection("rate_tokens", wait, f"token limit of {self.tokens_per_min}/min reached for this key")
        if self.requests_per_s:
            bucket = self._requests.setdefault(key, TokenBucket(self.requests_per_s, self.burst, self._clock))
            wait = bucket.take(1)
            if wait > 0:
                return Rejection("rate_requests", wait,
                                 f"request limit of {self.requests_per_s:g}/s reached for this key")
        return None

    def charge_tokens(self, key: str, tokens: int) -> None:
        """Debit ``tokens`` (negative: refund an over-estimate)."""
        if self.tokens_per_min and tokens:
            bucket = self._tokens.setdefault(key, TokenBucket(self.tokens_per_min / 60.0, self.tokens_per_min,
                                                              self._clock))
            bucket.charge(tokens)


# What an answer that came back whole without any usage is charged for its output, when its request
# names no max_tokens / max_completion_tokens / max_output_tokens (on the routes that generate text).
DEFAULT_OUTPUT_TOKENS = 1024
_MAX_OUTPUT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def max_output_tokens(body: dict[str, Any], generates: bool) -> int | None:
    """The most output a request may be answered with: its own limit, else DEFAULT_OUTPUT_TOKENS on a
    route that generates text; None on one that does not (embeddings, score, tokenize, ...)."""
    for name in _MAX_OUTPUT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_OUTPUT_TOKENS if generates else None


def tokens_used(estimate: int, prompt_tokens: int | None, completion_tokens: int | None, streamed_events: int,
                *, completed: bool = False, max_output: int | None = None) -> int:
    """What an answer cost, for the tokens/min limit.

    The prompt: the backend's usage (``prompt_tokens`` or ``input_tokens``), else the estimate
    charged up front. The output: a whole answer's usage; an answer that came back whole without
    usage is charged its request's ``max_output`` (never less than it streamed); one that did not
    finish (the client left, vLLM aborted it; or it broke) is charged what reached the router: the
    usage seen so far or one token per streamed event (vLLM sends one per token by default),
    whichever is more.
    """
    prompt = prompt_tokens if prompt_tokens is not None else estimate
    if completed and completion_tokens is not None:
        output = completion_tokens
    elif completed and max_output is not None:
        output = max(max_output, streamed_events)
    else:
        output = max(completion_tokens or 0, streamed_events)
    return prompt + output
