"""The [transcripts] section of the node's configuration: every namespace's policy and its parser."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from node.configbase import ConfigCode, ConfigError, expect, positive

# Values `replay` may take in a [transcripts] table.
REPLAY_MODES = ("allow", "deny")


@dataclass(frozen=True)
class TranscriptPolicy:
    """How one namespace keeps transcripts (docs/transcripts.md). Times in seconds, sizes in UTF-8 bytes."""

    # Off by default: a namespace stores transcripts only when it opts in.
    enabled: bool = False
    # A transcript moves from the hot table to the archive this long after it was stored ...
    ttl_s: float = 30 * 86_400.0
    # ... and is deleted, with its span links, this long after it was archived.
    prune_after_s: float = 60 * 86_400.0
    # Largest transcript (UTF-8 bytes of the text) a store or a peer may bring.
    max_bytes: int = 1024 * 1024
    # Most spans one transcript may cite.
    max_spans: int = 1000
    # Whole-transcript replay (full=true): "allow" | "deny". Cited spans are always replayable.
    replay: str = "deny"
    # Replicate this namespace's transcripts to the peers that may see it (else they stay on this node).
    replicate: bool = False


@dataclass(frozen=True)
class TranscriptsConfig:
    # Every namespace not named below.
    default: TranscriptPolicy = TranscriptPolicy()
    # Per-namespace policies: [transcripts."<ns>"], each key defaulting to the table above.
    namespaces: dict[str, TranscriptPolicy] = field(default_factory=dict)
    # Most transcripts one lifecycle pass archives or prunes per namespace (one transaction each).
    lifecycle_batch: int = 500
    # A running node makes one lifecycle pass this often (`ai-memory transcript lifecycle` makes one now).
    lifecycle_interval_s: float = 3600.0

    def policy(self, namespace: str) -> TranscriptPolicy:
        return self.namespaces.get(namespace, self.default)



_TRANSCRIPTS_PASS_KEYS = ("lifecycle_batch", "lifecycle_interval_s")


def parse_transcripts(raw: dict[str, Any]) -> TranscriptsConfig:
    """[transcripts]: the policy keys give every namespace's default; a sub-table per namespace overrides them."""
    policy_keys = {f.name for f in dataclasses.fields(TranscriptPolicy)}
    top = {k: v for k, v in raw.items() if k in policy_keys}
    batch = raw.get("lifecycle_batch", TranscriptsConfig.lifecycle_batch)
    interval = raw.get("lifecycle_interval_s", TranscriptsConfig.lifecycle_interval_s)
    default = _transcript_policy("transcripts", TranscriptPolicy(), top)
    namespaces = {}
    for key, value in raw.items():
        if key in policy_keys or key in _TRANSCRIPTS_PASS_KEYS:
            continue
        if not isinstance(value, dict):
            raise ConfigError(ConfigCode.CONFIG_UNKNOWN_KEY,
                              f"unknown config key 'transcripts.{key}'; known: "
                              f"{sorted(policy_keys | set(_TRANSCRIPTS_PASS_KEYS))} or a "
                              "[transcripts.\"<namespace>\"] table")
        namespaces[key] = _transcript_policy(f"transcripts.{key!r}", default, value)
    return TranscriptsConfig(default=default, namespaces=namespaces,
                             lifecycle_batch=expect(int, "transcripts.lifecycle_batch", batch),
                             lifecycle_interval_s=float(expect((int, float), "transcripts.lifecycle_interval_s",
                                                                interval)))


def _transcript_policy(where: str, base: TranscriptPolicy, raw: dict[str, Any]) -> TranscriptPolicy:
    fields = {f.name: f for f in dataclasses.fields(TranscriptPolicy)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{where}.{key}"
        if key not in fields:
            raise ConfigError(ConfigCode.CONFIG_UNKNOWN_KEY, f"unknown config key {dotted!r}; known: {sorted(fields)}")
        default = getattr(TranscriptPolicy(), key)
        if isinstance(default, bool):
            kwargs[key] = expect(bool, dotted, value)
        elif isinstance(default, float):
            kwargs[key] = float(expect((int, float), dotted, value))
        else:
            kwargs[key] = expect(type(default), dotted, value)
    policy = dataclasses.replace(base, **kwargs)
    for key in ("ttl_s", "prune_after_s", "max_bytes", "max_spans"):
        positive(f"{where}.{key}", getattr(policy, key))
    if policy.replay not in REPLAY_MODES:
        raise ConfigError(ConfigCode.CONFIG_INVALID, f"{where}.replay must be allow|deny, got {policy.replay!r}")
    return policy
