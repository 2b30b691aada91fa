"""Each variable's parser: raw text -> value, or ValueError with what is accepted (the precise
one-line error `parse_config` reports)."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from supervisor.config.values import PREFIX, SELECTOR_TERM
from supervisor.decide import disruption
from supervisor.decide.policy import (
    Rule,
    parse_codes,
    parse_events,
)
from supervisor.hook.elastic_supervisor_hook import wire
from supervisor.workers import DNS_LABEL


def _int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    accepted = f"an integer >= {lo}" if hi is None else f"an integer {lo}..{hi}"

    def parse(raw: str) -> int:
        try:
            value = int(raw.strip(), 10)
        except ValueError:
            raise ValueError(accepted) from None
        if value < lo or (hi is not None and value > hi):
            raise ValueError(accepted)
        return value

    return parse


def _seconds(lo: float, *, allow_zero: bool = False) -> Callable[[str], float]:
    accepted = f"a number of seconds > {lo}" if not allow_zero else "a number of seconds >= 0"

    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(accepted) from None
        if math.isnan(value) or math.isinf(value):
            raise ValueError(accepted)
        if (value < 0) if allow_zero else (value <= lo):
            raise ValueError(accepted)
        return value

    return parse


def _seconds_in(lo: float, hi: float) -> Callable[[str], float]:
    accepted = f"a number of seconds from {lo:g} to {hi:g}"

    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(accepted) from None
        if not lo <= value <= hi:  # also refuses nan
            raise ValueError(accepted)
        return value

    return parse


def _at_least(lo: float, why: str) -> Callable[[str], float]:
    accepted = f"a number of seconds >= {lo:g} ({why})"

    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(accepted) from None
        if math.isnan(value) or math.isinf(value) or value < lo:
            raise ValueError(accepted)
        return value

    return parse


def _watch_read_timeout(raw: str) -> float:
    value = _seconds(0)(raw)
    if value <= 60:
        raise ValueError("more than 60 seconds (watch bookmarks come about once a minute)")
    return value


def _enum(kind: type[StrEnum], *, fold: bool = True) -> Callable[[str], StrEnum]:
    def parse(raw: str) -> StrEnum:
        try:
            return kind(raw.strip().lower() if fold else raw.strip())
        except ValueError:
            raise ValueError("one of " + "|".join(m.value for m in kind)) from None

    return parse


def _dns_label(raw: str) -> str:
    if not DNS_LABEL.match(raw):
        raise ValueError("a DNS label: lower-case letters, digits and '-', at most 63 characters")
    return raw


def _selector(raw: str) -> str:
    terms = [t.strip() for t in raw.split(",")]
    if not raw.strip() or not all(SELECTOR_TERM.match(t) for t in terms):
        raise ValueError("a label selector like 'key=value,other!=x' (no set-based terms)")
    return ",".join(terms)


def _abs_path(raw: str) -> Path:
    p = Path(raw)
    if not p.is_absolute():
        raise ValueError("an absolute path")
    return p


def _read(read_text: Callable[[Path], str], raw: str, what: str) -> tuple[Path, str]:
    """The absolute path `raw` and its text; ValueError "a readable <what> (why)" if not."""
    path = _abs_path(raw)
    try:
        return path, read_text(path)
    except OSError as e:
        raise ValueError(f"a readable {what} ({e.strerror or e})") from None


def _hook_key(raw: str, read_text: Callable[[Path], str]) -> tuple[Path, bytes]:
    path, text = _read(read_text, raw, "file with the hook's key")
    try:
        return path, wire.parse_key(text, "")
    except ValueError:
        raise ValueError(f"a file with at least {2 * wire.MIN_KEY_BYTES} hex digits (e.g. "
                         "`openssl rand -hex 32`)") from None


# A known_hosts line with a key: [@cert-authority] hosts keytype base64 [comment].
KNOWN_HOST_KEY = re.compile(
    r"(?:@cert-authority\s+)?\S+\s+(?:ssh|ecdsa|sk)-\S+\s+[A-Za-z0-9+/]+=*(?:\s.*)?")


def _known_hosts(raw: str, read_text: Callable[[Path], str]) -> Path:
    path, text = _read(read_text, raw, "known_hosts file")
    if not any(KNOWN_HOST_KEY.fullmatch(line.strip()) for line in text.splitlines()):
        raise ValueError("a known_hosts file with at least one host key line, like "
                         "'* ssh-ed25519 AAAA...' (manifests/ssh-keygen.sh writes one)")
    return path


def _fraction_or_off(raw: str) -> float | None:
    accepted = "a fraction in (0, 1] like 0.55, or off"
    value = raw.strip().lower()
    if value == "off":
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(accepted) from None
    if not 0 < number <= 1:  # also refuses nan
        raise ValueError(accepted)
    return number


def _factor_or_off(raw: str) -> float:
    """A factor > 1, or off (0.0)."""
    accepted = "a factor > 1 like 2.0, or off"
    value = raw.strip().lower()
    if value == "off":
        return 0.0
    try:
        number = float(value)
    except ValueError:
        raise ValueError(accepted) from None
    if not 1 < number < math.inf:  # also refuses nan
        raise ValueError(accepted)
    return number


def _seconds_or(word: str, lo: float) -> Callable[[str], float | None]:
    """Seconds >= `lo`, or `word` (auto, off) for None."""
    number = _at_least(lo, "")
    accepted = f"{word}, or a number of seconds >= {lo:g}"

    def parse(raw: str) -> float | None:
        if raw.strip().lower() == word:
            return None
        try:
            return number(raw)
        except ValueError:
            raise ValueError(accepted) from None

    return parse


def _names(what: str, example: str) -> Callable[[str], frozenset[str]]:
    return lambda raw: disruption.parse_names(raw, what, example)


def _nonempty(raw: str) -> str:
    if not raw.strip() or any(c.isspace() for c in raw.strip()):
        raise ValueError("a non-empty word without spaces")
    return raw.strip()


def _codes(raw: str) -> tuple[tuple[int, int], ...]:
    try:
        return parse_codes(raw)
    except ValueError as e:
        raise ValueError(f"exit codes like '137,143,128-255' ({e})") from None


def _events(raw: str) -> frozenset[object]:
    try:
        return parse_events(raw)  # type: ignore[return-value]
    except ValueError as e:
        raise ValueError(f"comma-separated events ({e})") from None


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError("true|false")
    return value in ("true", "1", "yes")


def _args(raw: str) -> tuple[str, ...]:
    try:
        words = tuple(shlex.split(raw))
    except ValueError as e:
        raise ValueError(f"shell-style words with balanced quotes ({e})") from None
    if repeated := [(w, o) for w in words if (o := owned_option(w)) is not None]:
        raise ValueError("no option the supervisor sets itself (horovodrun takes the last one "
                         "given: it would override the supervisor's); " + "; ".join(
                             f"{w!r} is {o}: set {PREFIX}{OWNED_OPTIONS[o]} instead"
                             for w, o in repeated))
    return words


# horovodrun's options that the supervisor sets itself (supervisor.launch), in every spelling
# horovodrun 0.28 takes, with the variable that sets each. HOROVODRUN_EXTRA_ARGS may not repeat
# one: argparse keeps the last value, so it would silently override the supervisor's.
OWNED_OPTIONS = {
    "-np": "NP", "--num-proc": "NP",
    "--min-np": "MIN_NP", "--min-num-proc": "MIN_NP",
    "--max-np": "MAX_NP", "--max-num-proc": "MAX_NP",
    "--slots-per-host": "SLOTS_PER_WORKER",
    "--host-discovery-script": "DISCOVERY_SCRIPT",
    "-p": "SSH_PORT", "--ssh-port": "SSH_PORT",
    "-i": "SSH_IDENTITY_FILE", "--ssh-identity-file": "SSH_IDENTITY_FILE",
    "--network-interface": "NETWORK_INTERFACE", "--network-interfaces": "NETWORK_INTERFACE",
    "--gloo-timeout-seconds": "GLOO_TIMEOUT_SECONDS",
}
# horovodrun options of their own that begin like one of those (an exact name wins over an
# abbreviation in argparse).
_NOT_OWNED = ("--gloo", "-prefix-timestamp")


def owned_option(word: str) -> str | None:
    """The option of OWNED_OPTIONS that horovodrun's argparse reads `word` as, or None: the
    name, `name=value`, an abbreviation of a long name (`--ssh-p`), a short one with its value
    attached (`-p2222`)."""
    name = word.split("=", 1)[0]
    if not word.startswith("-") or name in _NOT_OWNED:
        return None
    if name in OWNED_OPTIONS:
        return name
    if name.startswith("--") and len(name) > 2:
        hits = [o for o in OWNED_OPTIONS if o.startswith(name)]
        # Abbreviating two of them is ambiguous to argparse: horovodrun refuses it itself.
        return hits[0] if hits and {OWNED_OPTIONS[o] for o in hits} == {
            OWNED_OPTIONS[hits[0]]} else None
    short = name[:2]
    if short in OWNED_OPTIONS and not any(o.startswith(name) for o in _NOT_OWNED):
        return short
    return None


# ---- the variables ------------------------------------------------------------------------------

def _none_is(word: str) -> Callable[[object], object]:
    """`explain`'s value of a variable whose None is spelled `word` (off, auto)."""
    return lambda value: word if value is None else value


def _rule_of(name: str) -> Callable[[tuple[Rule, ...]], str | None]:
    """`explain`'s value of a rules variable: what the rule it made matches (None: it made none)."""
    return lambda rules: next((r.what() for r in rules if r.name == PREFIX + name), None)
