"""The testbed's one error: a stable ``code`` (the CLI maps usage codes to exit 2) and a sentence."""

from __future__ import annotations

from enum import StrEnum

from base.errors import ProjectError


class TestbedCode(StrEnum):
    """The codes a TestbedError carries."""

    BACKEND_UNAVAILABLE = "backend_unavailable"
    BAD_FAULT = "bad_fault"
    BAD_MESSAGES = "bad_messages"
    BAD_NETEM = "bad_netem"
    BAD_NODE_COUNT = "bad_node_count"
    BAD_OPTION = "bad_option"
    BAD_PORT = "bad_port"
    BAD_STATE = "bad_state"
    BENCH_REJECTED = "bench_rejected"
    DIR_NOT_DIR = "dir_not_dir"
    DIR_NOT_EMPTY = "dir_not_empty"
    DIR_TOO_LONG = "dir_too_long"
    DOCKER_FAILED = "docker_failed"
    DOCKER_TIMEOUT = "docker_timeout"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    EVERYTHING_ON_NOT_LOADED = "everything_on_not_loaded"
    FAULT_FAILED = "fault_failed"
    FRESH_CHECK_FAILED = "fresh_check_failed"
    IMAGE_FAILED = "image_failed"
    LINKS_NOT_UP = "links_not_up"
    NETNS_FAILED = "netns_failed"
    NETNS_UNAVAILABLE = "netns_unavailable"
    NO_BASE_IMAGE = "no_base_image"
    NO_LOG = "no_log"
    NO_NETNS = "no_netns"
    NO_TESTBED = "no_testbed"
    NODE_EXITED = "node_exited"
    NOT_READY = "not_ready"
    PORT_IN_USE = "port_in_use"
    STALE_STATE = "stale_state"
    STOP_FAILED = "stop_failed"
    TMPFS_REFUSED = "tmpfs_refused"
    UNKNOWN_NODE = "unknown_node"


class TestbedError(ProjectError):
    """A testbed command that cannot go on; ``code`` is stable (the CLI maps usage codes to exit 2)."""
