"""Envelope and ACK types and their CBOR codec (docs/protocol.md, "Envelope and ACK").

Wire forms (canonical CBOR maps, RFC 8949 §4.2.1):
  envelope ``{v: 1, type: "msg", correlation_id, sender, recipients: [...], payload: {kind, ...}, expires_at}``
  ack      ``{v: 1, type: "ack", correlation_id, recipient, accepted, reason}``
  batch    ``{v: 1, type: "batch", items: [<bstr: one envelope or ACK frame>, ...]}`` (only between peers
           that negotiated it, see ``BATCH_SUBPROTOCOL``)
All times are integer unix milliseconds.
"""

from __future__ import annotations

import functools
import io
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cbor2

from a2a.errors import ErrorCode, ProtocolError

VERSION = 1
TYPE_MSG = "msg"
TYPE_ACK = "ack"
TYPE_BATCH = "batch"
# The WebSocket subprotocol both ends name on the upgrade to say "I read batch frames". A peer that
# does not echo it gets one envelope (and one ACK) per frame.
BATCH_SUBPROTOCOL = "a2a-batch.1"
# Items in one batch frame.
MAX_BATCH_ITEMS = 256
# Bytes of one batch frame a sender builds, and that every receiver accepts even when its message limit is
# lower (each item is still held to the receiver's own limit): a sender does not know the peer's limit.
BATCH_MAX_BYTES = 64 * 1024
# Protocol-shape bounds (not operator tunables): they keep one frame cheap to validate.
# An agent id also names its key files (mesh/keys.py validate_agent_id): one bound for both.
MAX_AGENT_ID_CHARS = 128
MAX_RECIPIENTS = 1024
MAX_PAYLOAD_DEPTH = 32
MAX_REASON_CODE_CHARS = 64
# CBOR major types 0/1 hold exactly these; anything wider needs a bignum tag, which we refuse.
_INT_MIN = -(2**64)
_INT_MAX = 2**64 - 1

REASON_DUPLICATE = "duplicate"
REASON_REJECTED_PREFIX = "rejected:"
# Rejections that a later attempt can cure (the receiver lacks something that is on its way),
# so the sender keeps its retry schedule instead of dead-lettering.
RETRYABLE_REJECT_CODES = frozenset({"unknown_memory", "unknown_link", "storage_full", "rate_limited",
                                    # an agent's item that overtook its delegation (docs/protocol.md, "Agents")
                                    "unknown_delegation"})

_ENVELOPE_KEYS = frozenset({"v", "type", "correlation_id", "sender", "recipients", "payload", "expires_at"})
_ACK_KEYS = frozenset({"v", "type", "correlation_id", "recipient", "accepted", "reason"})
_BATCH_KEYS = frozenset({"v", "type", "items"})
_UUID4_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_CODE_RE = re.compile(r"[a-z][a-z0-9_]*")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _short(value: Any) -> str:
    """repr() bounded so that error messages stay readable for hostile inputs."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_int(value: object) -> bool:
    """True for int but not bool (bool is an int subclass in Python, never on our wire)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_uuid4(value: object) -> bool:
    """True for a canonical lowercase hyphenated UUIDv4 string (RFC 9562 variant bits)."""
    return isinstance(value, str) and _UUID4_RE.fullmatch(value) is not None


def check_correlation_id(value: object) -> str:
    if not is_uuid4(value):
        raise ProtocolError(
            ErrorCode.BAD_CORRELATION_ID,
            f"correlation_id must be a lowercase UUIDv4 string, got {_short(value)}",
        )
    return value  # type: ignore[return-value]


def _check_agent_id(field: str, value: object, cid: str | None) -> str:
    if not isinstance(value, str) or not value:
        raise ProtocolError(
            ErrorCode.BAD_FIELD, f"{field} must be a non-empty string, got {_short(value)}", correlation_id=cid
        )
    if len(value) > MAX_AGENT_ID_CHARS:
        raise ProtocolError(
            ErrorCode.BAD_FIELD,
            f"{field} is {len(value)} characters long, more than {MAX_AGENT_ID_CHARS}",
            correlation_id=cid,
        )
    if _CONTROL_RE.search(value):
        raise ProtocolError(
            ErrorCode.BAD_FIELD, f"{field} contains control characters: {_short(value)}", correlation_id=cid
        )
    return value


def _check_plain(path: str, value: object, depth: int, cid: str | None) -> None:
    """Payload values must be plain CBOR data: null, bool, int (64-bit), float, str, bytes, list, str-keyed map."""
    if depth > MAX_PAYLOAD_DEPTH:
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD, f"{path} is nested deeper than {MAX_PAYLOAD_DEPTH} levels", correlation_id=cid
        )
    if value is None or isinstance(value, (bool, float, str, bytes)):
        return
    if is_int(value):
        if not _INT_MIN <= value <= _INT_MAX:  # type: ignore[operator]
            raise ProtocolError(
                ErrorCode.BAD_PAYLOAD, f"{path} is an integer outside the 64-bit CBOR range", correlation_id=cid
            )
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(f"{path}[{i}]", item, depth + 1, cid)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(
                    ErrorCode.BAD_PAYLOAD, f"{path} has a non-string key {_short(key)}", correlation_id=cid
                )
            _check_plain(f"{path}.{key}", item, depth + 1, cid)
        return
    raise ProtocolError(
        ErrorCode.BAD_PAYLOAD,
        f"{path} holds a {type(value).__name__}, which is not plain CBOR data",
        correlation_id=cid,
    )


class _NotFast(Exception):
    """Raised by ``_plain_copy`` for anything off its fast path; the full check then decides."""


def _plain_copy(value: Any, depth: int) -> Any:
    """Copy of ``value`` when it is plain CBOR data made only of exact builtin types (dict with str keys,
    list, str, int in the 64-bit range, float, bool, bytes, None) within ``MAX_PAYLOAD_DEPTH``; else
    ``_NotFast``. One pass for what ``_check_plain`` and ``_thaw`` do in two, with no path strings built."""
    if depth > MAX_PAYLOAD_DEPTH:
        raise _NotFast
    t = type(value)
    if t is str or t is float or t is bool or t is bytes or value is None:
        return value
    if t is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
        raise _NotFast
    if t is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotFast
            out[key] = _plain_copy(item, depth + 1)
        return out
    if t is list:
        return [_plain_copy(item, depth + 1) for item in value]
    raise _NotFast


def _agent_ids_fast(values: Sequence[Any]) -> bool:
    """True when every value is a str of 1..MAX_AGENT_ID_CHARS characters without control characters
    (what ``_check_agent_id`` accepts, checked for the whole list at once); False means check each."""
    for value in values:  # a plain loop: cheaper than set/min/max over the few recipients of a frame
        if type(value) is not str or not 0 < len(value) <= MAX_AGENT_ID_CHARS:
            return False
    return bool(values) and _CONTROL_RE.search("".join(values)) is None


def _check_recipients(recipients: object, cid: str) -> None:
    if isinstance(recipients, (str, bytes)) or not isinstance(recipients, (list, tuple)):
        raise ProtocolError(
            ErrorCode.BAD_FIELD, f"recipients must be a list of agent ids, got {_short(recipients)}",
            correlation_id=cid,
        )
    if not recipients or len(recipients) > MAX_RECIPIENTS:
        raise ProtocolError(
            ErrorCode.BAD_FIELD,
            f"recipients must hold 1 to {MAX_RECIPIENTS} agent ids, got {len(recipients)}",
            correlation_id=cid,
        )
    if not _agent_ids_fast(recipients):
        for i, recipient in enumerate(recipients):
            _check_agent_id(f"recipients[{i}]", recipient, cid)
    if len(set(recipients)) != len(recipients):
        raise ProtocolError(ErrorCode.BAD_FIELD, "recipients lists an agent id twice", correlation_id=cid)


def _payload_copy(payload: Mapping[str, Any], cid: str) -> Any:
    """The checked payload as a plain dict (never the caller's object); ProtocolError when not plain data."""
    try:
        return _plain_copy(payload, 1)
    except _NotFast:  # a subclass, a tuple, or something wrong: the full check says which
        _check_plain("payload", payload, 1, cid)
        return _thaw(payload)


def _thaw(value: Any) -> Any:
    """Plain dict/list copy, so an Envelope never shares mutable state with its caller."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value


def _checked_fields(cid: str, sender: object, recipients: object, payload: object,
                    expires_at: object) -> tuple[tuple[str, ...], dict[str, Any]]:
    """An envelope's checks past its version and correlation_id (ProtocolError naming the first field that
    fails): its recipients as a tuple and a plain copy of its payload."""
    _check_agent_id("sender", sender, cid)
    _check_recipients(recipients, cid)
    if not is_int(expires_at) or not 0 <= expires_at <= _INT_MAX:  # type: ignore[operator]
        raise ProtocolError(
            ErrorCode.BAD_FIELD,
            f"expires_at must be a non-negative integer (unix ms), got {_short(expires_at)}",
            correlation_id=cid,
        )
    if type(payload) is not dict and not isinstance(payload, Mapping):
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD, f"payload must be a map, got {type(payload).__name__}", correlation_id=cid
        )
    kind = payload.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD, f"payload.kind must be a non-empty string, got {_short(kind)}",
            correlation_id=cid,
        )
    plain = _payload_copy(payload, cid)
    return (recipients if type(recipients) is tuple else tuple(recipients)), plain  # type: ignore[arg-type]


@dataclass(frozen=True)
class Envelope:
    """One A2A message. ``expires_at`` is unix ms; ``payload`` is a map holding ``kind``.

    Construction validates every field (ProtocolError on failure), so an Envelope in hand is well-formed.
    The payload's per-kind schema is checked separately by ``a2a.kinds.validate_payload``.
    """

    correlation_id: str
    sender: str
    recipients: tuple[str, ...]
    payload: Mapping[str, Any]
    expires_at: int
    v: int = VERSION

    def __post_init__(self) -> None:
        if not is_int(self.v) or self.v != VERSION:
            raise ProtocolError(ErrorCode.BAD_VERSION, f"v must be {VERSION}, got {_short(self.v)}")
        cid = check_correlation_id(self.correlation_id)
        recipients, plain = _checked_fields(cid, self.sender, self.recipients, self.payload, self.expires_at)
        if recipients is not self.recipients:
            object.__setattr__(self, "recipients", recipients)
        object.__setattr__(self, "payload", plain)

    @property
    def kind(self) -> str:
        return str(self.payload["kind"])

    def to_map(self) -> dict[str, Any]:
        return {
            "v": self.v,
            "type": TYPE_MSG,
            "correlation_id": self.correlation_id,
            "sender": self.sender,
            "recipients": list(self.recipients),
            "payload": self.payload,
            "expires_at": self.expires_at,
        }

    def to_wire(self) -> bytes:
        """Canonical CBOR bytes of this envelope."""
        return cbor2.dumps(self.to_map(), canonical=True)


@dataclass(frozen=True)
class Ack:
    """A receiver's answer to one envelope.

    ``reason`` is None when accepted, else ``"duplicate"`` or ``"rejected:<code>"``.
    """

    correlation_id: str
    recipient: str
    accepted: bool
    reason: str | None

    def __post_init__(self) -> None:
        cid = check_correlation_id(self.correlation_id)
        _check_agent_id("recipient", self.recipient, cid)
        if not isinstance(self.accepted, bool):
            raise ProtocolError(
                ErrorCode.BAD_FIELD, f"accepted must be a boolean, got {_short(self.accepted)}", correlation_id=cid
            )
        reason = self.reason
        if self.accepted:
            if reason is not None:
                raise ProtocolError(
                    ErrorCode.BAD_FIELD, f"reason must be null when accepted, got {_short(reason)}",
                    correlation_id=cid,
                )
            return
        if reason == REASON_DUPLICATE:
            return
        if isinstance(reason, str) and reason.startswith(REASON_REJECTED_PREFIX):
            code = reason[len(REASON_REJECTED_PREFIX):]
            if len(code) <= MAX_REASON_CODE_CHARS and _CODE_RE.fullmatch(code):
                return
        raise ProtocolError(
            ErrorCode.BAD_FIELD,
            f"reason must be 'duplicate' or 'rejected:<snake_case_code>' when not accepted, got {_short(reason)}",
            correlation_id=cid,
        )

    @classmethod
    def ok(cls, correlation_id: str, recipient: str) -> Ack:
        """The message was applied and durably stored."""
        # __post_init__'s checks for an accepted ACK, then the fields set at once (one ACK per message
        # received: the frozen dataclass's constructor sets each through object.__setattr__).
        cid = check_correlation_id(correlation_id)
        _check_agent_id("recipient", recipient, cid)
        return _filled_ack(cid, recipient, True, None)

    @classmethod
    def duplicate(cls, correlation_id: str, recipient: str) -> Ack:
        """The message was already applied earlier; nothing was done."""
        return cls(correlation_id, recipient, False, REASON_DUPLICATE)

    @classmethod
    def rejected(cls, correlation_id: str, recipient: str, code: str) -> Ack:
        """The message will never be accepted; ``code`` is a snake_case reason such as ``sender_mismatch``."""
        return cls(correlation_id, recipient, False, REASON_REJECTED_PREFIX + str(code))

    @property
    def is_duplicate(self) -> bool:
        return self.reason == REASON_DUPLICATE

    @property
    def reject_code(self) -> str | None:
        """The ``<code>`` of ``rejected:<code>``, else None."""
        if self.reason is None or not self.reason.startswith(REASON_REJECTED_PREFIX):
            return None
        return self.reason[len(REASON_REJECTED_PREFIX):]

    @property
    def permanent(self) -> bool:
        """True for a rejection the sender must not retry (it dead-letters instead)."""
        code = self.reject_code
        return code is not None and code not in RETRYABLE_REJECT_CODES

    def to_map(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "type": TYPE_ACK,
            "correlation_id": self.correlation_id,
            "recipient": self.recipient,
            "accepted": self.accepted,
            "reason": self.reason,
        }

    def to_wire(self) -> bytes:
        """Canonical CBOR bytes of this ACK.

        The map is built in canonical key order (shorter keys first, then bytewise) and holds only
        strings, a bool and null, so plain encoding gives the canonical bytes without sorting (one ACK
        per message on the receive path)."""
        if self.accepted:  # the receive path's ACK: a template with the correlation_id spliced in
            return accepted_ack_prefix(self.recipient) + self.correlation_id.encode("ascii")
        return cbor2.dumps({
            "v": VERSION,
            "type": TYPE_ACK,
            "reason": self.reason,
            "accepted": self.accepted,
            "recipient": self.recipient,
            "correlation_id": self.correlation_id,
        })


# The canonical bytes of an accepted ACK, {v: 1, type: "ack", reason: null, accepted: true, recipient: <text>,
# correlation_id: <text of 36 ASCII characters>} (keys in canonical order), as a head, the recipient, and the
# correlation_id's key and text head; only the correlation_id's 36 characters follow.
_ACK_OK_HEAD = b"\xa6" + b"".join(cbor2.dumps(x) for x in ("v", VERSION, "type", TYPE_ACK, "reason", None,
                                                           "accepted", True, "recipient"))
_ACK_CID_HEAD = cbor2.dumps("correlation_id") + b"\x78\x24"
_UUID_CHARS = 36


@functools.lru_cache(maxsize=1024)
def accepted_ack_prefix(recipient: str) -> bytes:
    """The canonical bytes of an accepted ACK from ``recipient`` up to its correlation_id's 36 characters.
    ProtocolError when ``recipient`` is not a valid agent id."""
    _check_agent_id("recipient", recipient, None)
    return _ACK_OK_HEAD + cbor2.dumps(str(recipient)) + _ACK_CID_HEAD


def accepted_ack(data: bytes, recipient: str, max_bytes: int) -> Ack | None:
    """``data`` as the ACK ``decode_wire`` makes of it when it is, byte for byte, the canonical accepted ACK from
    ``recipient`` with a valid correlation_id (one comparison instead of a CBOR decode, for the frame a
    sender gets back for nearly every envelope); None for anything else, which takes ``decode_wire``."""
    if type(data) is not bytes or len(data) > max_bytes:
        return None
    try:
        prefix = accepted_ack_prefix(recipient)
    except ProtocolError:
        return None
    if len(data) != len(prefix) + _UUID_CHARS or not data.startswith(prefix):
        return None
    try:
        cid = data[-_UUID_CHARS:].decode("ascii")
    except UnicodeDecodeError:
        return None
    if _UUID4_RE.fullmatch(cid) is None:
        return None
    return _filled_ack(cid, recipient, True, None)  # the recipient was checked when its prefix was made


def _filled_ack(cid: str, recipient: str, accepted: bool, reason: str | None) -> Ack:
    """An Ack of fields the caller checked as ``Ack.__post_init__`` would, made without running it again."""
    ack = object.__new__(Ack)
    ack.__dict__.update(correlation_id=cid, recipient=recipient, accepted=accepted, reason=reason)
    return ack


def new_envelope(
    sender: str, recipients: Iterable[str], payload: Mapping[str, Any], now_ms: int, ttl_ms: int
) -> Envelope:
    """A fresh envelope with a new UUIDv4 correlation_id, expiring at ``now_ms + ttl_ms`` (unix ms)."""
    if not is_int(now_ms) or not is_int(ttl_ms) or ttl_ms <= 0:
        raise ProtocolError(
            ErrorCode.BAD_FIELD, f"now_ms and ttl_ms must be integers with ttl_ms > 0, got {now_ms!r}, {ttl_ms!r}"
        )
    return Envelope(
        correlation_id=str(uuid.uuid4()),
        sender=sender,
        recipients=tuple(recipients),
        payload=payload,
        expires_at=now_ms + ttl_ms,
    )


class _DenyAllTags(Mapping[int, Any]):
    """semantic_decoders that refuses every CBOR tag before cbor2 builds datetimes, regexes, bignums…"""

    def __getitem__(self, tag: int) -> Any:
        def refuse(decoder: Any) -> Any:
            raise cbor2.CBORDecodeError(f"CBOR tag {tag} is not allowed")

        return refuse

    def __contains__(self, tag: object) -> bool:
        return True

    def __iter__(self) -> Iterator[int]:
        return iter(())

    def __len__(self) -> int:
        return 0


_DENY_ALL_TAGS = _DenyAllTags()


def _refuse_tag(decoder: Any, tag: Any) -> Any:
    raise cbor2.CBORDecodeError(f"CBOR tag {getattr(tag, 'tag', '?')} is not allowed")


def _new_decoder(fp: io.BytesIO) -> cbor2.CBORDecoder:
    return cbor2.CBORDecoder(
        fp,
        tag_hook=_refuse_tag,
        semantic_decoders=_DENY_ALL_TAGS,
        max_depth=MAX_PAYLOAD_DEPTH + 4,
        allow_indefinite=False,
        allow_duplicate_keys=False,
        strict_hashable_types=True,
    )


# One decoder per thread, pointed at each frame in turn (building one costs ~1.6 µs, a third of a ping's
# decode). A decode that fails drops it, so that nothing a bad frame left behind reaches the next frame.
_DECODERS = threading.local()


def _loads_one(data: bytes) -> Any:
    """Decode exactly one CBOR item spanning all of ``data``; any failure is ``malformed``."""
    fp = io.BytesIO(data)
    decoder = getattr(_DECODERS, "decoder", None)
    try:
        if decoder is None:
            decoder = _DECODERS.decoder = _new_decoder(fp)
        else:
            decoder.fp = fp
        obj = decoder.decode()
        trailing = len(data) - fp.tell()
    except Exception as exc:  # cbor2 raises several types (and RecursionError/MemoryError in odd builds)
        _DECODERS.decoder = None
        raise ProtocolError(ErrorCode.MALFORMED, f"frame is not valid CBOR: {_short(str(exc))}") from None
    if trailing:
        raise ProtocolError(ErrorCode.MALFORMED, f"frame has {trailing} trailing bytes after the CBOR item")
    return obj


def _check_keys(obj: dict[Any, Any], expected: frozenset[str], what: str, cid: str | None) -> None:
    if obj.keys() == expected:
        return
    keys = set(obj)
    missing = expected - keys
    if missing:
        raise ProtocolError(
            ErrorCode.BAD_FIELD, f"{what} is missing field(s) {sorted(missing)}", correlation_id=cid
        )
    extra = keys - expected
    if extra:
        raise ProtocolError(
            ErrorCode.BAD_FIELD, f"{what} has unknown field(s) {_short(sorted(map(str, extra)))}", correlation_id=cid
        )


def _frame_map(data: bytes, max_bytes: int) -> dict[Any, Any]:
    """The frame's CBOR map, after the size limit (bytes) and the protocol version are checked."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(ErrorCode.MALFORMED, f"frame must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"frame is {len(data)} bytes, more than the limit of {max_bytes}")
    obj = _loads_one(data)
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.MALFORMED, f"frame must be a CBOR map, got {type(obj).__name__}")
    v = obj.get("v")
    if not is_int(v) or v != VERSION:
        raise ProtocolError(ErrorCode.BAD_VERSION, f"v must be {VERSION}, got {_short(v)}")
    return obj


def _envelope_from_map(obj: dict[Any, Any], cid: str) -> Envelope:
    recipients = obj["recipients"]
    if not isinstance(recipients, list):
        raise ProtocolError(
            ErrorCode.BAD_FIELD, f"recipients must be an array, got {_short(recipients)}", correlation_id=cid
        )
    # The checks Envelope() makes, once: the version and correlation_id were checked by the caller.
    sender, expires_at = obj["sender"], obj["expires_at"]
    checked, payload = _checked_fields(cid, sender, recipients, obj["payload"], expires_at)
    env = object.__new__(Envelope)
    env.__dict__.update(correlation_id=cid, sender=sender, recipients=checked, payload=payload,
                        expires_at=expires_at, v=VERSION)
    return env


def _ack_from_map(obj: dict[Any, Any], cid: str) -> Ack:
    return Ack(correlation_id=cid, recipient=obj["recipient"], accepted=obj["accepted"], reason=obj["reason"])


# frame type -> (its keys, its name in errors, its builder)
_FRAME_KINDS: dict[str, tuple[frozenset[str], str, Callable[[dict[Any, Any], str], Envelope | Ack]]] = {
    TYPE_MSG: (_ENVELOPE_KEYS, "envelope", _envelope_from_map),
    TYPE_ACK: (_ACK_KEYS, "ack", _ack_from_map),
}


def decode_frame(data: bytes, max_bytes: int) -> Envelope | Ack:
    """Parse one binary frame into an Envelope or Ack.

    Raises ProtocolError (and nothing else) for any bad input; the size limit (bytes) is checked
    before decoding.
    """
    return _frame_from_map(_frame_map(data, max_bytes))


def _frame_from_map(obj: dict[Any, Any]) -> Envelope | Ack:
    ftype = obj.get("type")
    kind = _FRAME_KINDS.get(ftype) if isinstance(ftype, str) else None
    if kind is None:
        raise ProtocolError(ErrorCode.BAD_TYPE, f"type must be 'msg' or 'ack', got {_short(ftype)}")
    expected, what, build = kind
    cid = check_correlation_id(obj.get("correlation_id"))
    _check_keys(obj, expected, what, cid)
    try:
        return build(obj, cid)
    except ProtocolError:
        raise
    except Exception as exc:  # defence in depth: validation bugs must still surface as protocol errors
        raise ProtocolError(
            ErrorCode.MALFORMED, f"frame could not be validated: {_short(str(exc))}", correlation_id=cid
        ) from None


def _cbor_head_len(n: int) -> int:
    """Bytes of a CBOR major-type head carrying length ``n``."""
    return 1 if n < 24 else 2 if n < 0x100 else 3 if n < 0x10000 else 5 if n < 0x1_0000_0000 else 9


# {v: 1, type: "batch", items: [...]} without the array's head and items.
BATCH_OVERHEAD = len(cbor2.dumps({"v": VERSION, "type": TYPE_BATCH, "items": []}, canonical=True)) - 1


def batch_size(item_lengths: Iterable[int]) -> int:
    """Bytes of the batch frame holding items of these lengths (what ``encode_batch`` returns)."""
    count = total = 0
    for n in item_lengths:
        count += 1
        total += _cbor_head_len(n) + n
    return BATCH_OVERHEAD + _cbor_head_len(count) + total


def batch_item_cost(item_length: int) -> int:
    """Bytes one item of ``item_length`` adds to a batch frame (not counting the array head's growth)."""
    return _cbor_head_len(item_length) + item_length


def encode_batch(items: Iterable[bytes]) -> bytes:
    """One batch frame carrying the given frames (each the canonical bytes of an envelope or an ACK)."""
    return cbor2.dumps({"v": VERSION, "type": TYPE_BATCH, "items": list(items)}, canonical=True)


def plan_batches(item_lengths: Sequence[int], max_items: int = MAX_BATCH_ITEMS,
                 max_bytes: int = BATCH_MAX_BYTES) -> list[range]:
    """Split items (by their lengths in bytes, in order) into runs that each fit one batch frame of at most
    ``max_items`` items and ``max_bytes`` bytes. A run of one item is sent as a plain frame, so an item too
    large for any batch gets a run of its own."""
    runs: list[range] = []
    start, size = 0, BATCH_OVERHEAD + 1
    for i, n in enumerate(item_lengths):
        cost = batch_item_cost(n)
        count = i - start
        # the array head grows from 1 to 2 bytes at 24 items and to 3 at 256
        head_growth = 1 if count in (23, 255) else 0
        if count and (count >= max_items or size + cost + head_growth > max_bytes):
            runs.append(range(start, i))
            start, size, head_growth = i, BATCH_OVERHEAD + 1, 0
        size += cost + head_growth
    if start < len(item_lengths):
        runs.append(range(start, len(item_lengths)))
    return runs


@dataclass(frozen=True, slots=True)
class Batch:
    """A decoded batch frame: its items, still undecoded (each is decided on its own)."""

    items: tuple[bytes, ...]


def decode_wire(data: bytes, max_bytes: int, max_items: int = MAX_BATCH_ITEMS) -> Envelope | Ack | Batch:
    """Parse one WebSocket frame: an envelope, an ACK or a batch of up to ``max_items`` frames.

    A batch's items are checked to be non-empty byte strings only; decode each with ``decode_frame``, so
    that a bad item is answered on its own. The whole frame is bounded by ``max_bytes`` (checked before
    decoding; a batch may reach ``BATCH_MAX_BYTES`` where that is larger). Raises ProtocolError (and nothing
    else) for any bad input.
    """
    obj = _frame_map(data, max(max_bytes, BATCH_MAX_BYTES))
    if obj.get("type") != TYPE_BATCH:
        if len(data) > max_bytes:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"frame is {len(data)} bytes, more than the limit of {max_bytes}")
        return _frame_from_map(obj)
    _check_keys(obj, _BATCH_KEYS, "batch", None)
    items = obj["items"]
    if not isinstance(items, list) or not items:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"batch items must be a non-empty array, got {_short(items)}")
    if len(items) > max_items:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"batch holds {len(items)} items, more than {max_items}")
    for i, item in enumerate(items):
        if not isinstance(item, bytes) or not item:
            raise ProtocolError(ErrorCode.BAD_FIELD,
                                f"batch items[{i}] must be a non-empty byte string, got {_short(item)}")
    return Batch(tuple(items))


__all__ = [
    "Ack",
    "accepted_ack",
    "BATCH_MAX_BYTES",
    "BATCH_SUBPROTOCOL",
    "Batch",
    "MAX_BATCH_ITEMS",
    "Envelope",
    "MAX_AGENT_ID_CHARS",
    "MAX_PAYLOAD_DEPTH",
    "MAX_RECIPIENTS",
    "batch_size",
    "decode_frame",
    "decode_wire",
    "encode_batch",
    "is_int",
    "plan_batches",
    "is_uuid4",
    "new_envelope",
]
