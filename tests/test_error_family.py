"""The project's one error family: every room's error derives from base.errors.ProjectError, every code the
project spells when it raises one is a member of that room's StrEnum, and one map gives each code its status."""

from __future__ import annotations

import ast
from enum import StrEnum
from pathlib import Path

import pytest

import testbed.errors as testbed_errors
from a2a.errors import ErrorCode, ProtocolError
from base.errors import HTTP_STATUS, ProjectError, describe, status_of
from mesh.errors import MeshCode, MeshError
from node.attest import AttestCode, AttestError
from node.config import ConfigCode, ConfigError
from node.errors import ServiceCode, ServiceError
from node.hooks.errors import HookCode, HookError
from storage.errors import StorageCode, StorageError

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOMS = ("a2a", "base", "mesh", "node", "storage", "testbed", "tools")
# Each error class, by the name it is raised under, and the enum its codes come from.
FAMILY: dict[str, tuple[type[ProjectError], type[StrEnum]]] = {
    "ProtocolError": (ProtocolError, ErrorCode),
    "MeshError": (MeshError, MeshCode),
    "StorageError": (StorageError, StorageCode),
    "ServiceError": (ServiceError, ServiceCode),
    "ConfigError": (ConfigError, ConfigCode),
    "AttestError": (AttestError, AttestCode),
    "HookError": (HookError, HookCode),
    "TestbedError": (testbed_errors.TestbedError, testbed_errors.TestbedCode),
}
# Exceptions that never leave the function family that raises them (control flow, not errors an edge sees).
INTERNAL = {"_NotFast", "HookFailed"}


def _sources() -> list[Path]:
    return sorted(p for room in SOURCE_ROOMS for p in (ROOT / room).rglob("*.py"))


def _raised_codes() -> list[tuple[str, str, str]]:
    """(where, class name, code) for every ``XError("literal", ...)`` in the source rooms."""
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            first = node.args[0]
            if name in FAMILY and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", name, first.value))
    return found


def test_every_code_the_project_raises_is_a_member_of_its_rooms_enum() -> None:
    found = _raised_codes()
    assert len(found) > 100  # the scan sees the raises
    strays = [(where, name, code) for where, name, code in found
              if code not in {m.value for m in FAMILY[name][1]}]
    assert strays == []


def test_every_error_class_of_the_project_derives_from_the_one_base() -> None:
    outside = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or node.name in INTERNAL | {"ProjectError"}:
                continue
            bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in
                     node.bases}
            if bases & {"Exception", "BaseException", "ValueError", "RuntimeError", "TypeError", "OSError"} \
                    and not bases & {"ProjectError", *FAMILY}:
                outside.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert outside == []


@pytest.mark.parametrize("cls", [cls for cls, _ in FAMILY.values()])
def test_each_rooms_error_is_a_project_error(cls: type[ProjectError]) -> None:
    assert issubclass(cls, ProjectError)


def test_storage_trouble_answers_a_server_status_not_a_client_one() -> None:
    assert StorageError(StorageCode.BUSY, "the database is locked").http_status == 503
    assert StorageError(StorageCode.STORAGE_FULL, "the disk is full").http_status == 503
    assert StorageError(StorageCode.STORAGE_CORRUPT, "malformed page").http_status == 503
    assert StorageError(StorageCode.CLOSED, "closed").http_status == 503


def test_one_map_answers_the_same_code_the_same_from_every_room() -> None:
    not_found = ServiceError(ServiceCode.NOT_FOUND, "x"), StorageError(StorageCode.NOT_FOUND, "x")
    assert [e.http_status for e in not_found] == [404, 404]
    limited = MeshError(MeshCode.RATE_LIMITED, "x"), ServiceError(ServiceCode.RATE_LIMITED, "x")
    assert [e.http_status for e in limited] == [429, 429]
    assert ServiceError(ServiceCode.BAD_INPUT, "x").http_status == 400
    assert all(100 <= s <= 599 for s in HTTP_STATUS.values())


def test_a_code_from_outside_the_enum_is_carried_as_it_is() -> None:
    # A hook's deny names its own code, and a peer's refusal its own: both reach the caller unchanged.
    e = HookError("no_secrets_please", "hook 'dlp' denied pre_store")
    assert e.code == "no_secrets_please" and e.http_status == status_of("no_secrets_please") == 400


def test_describe_reads_the_error_and_calls_anything_else_internal() -> None:
    d = describe(ServiceError(ServiceCode.QUOTA_EXCEEDED, "over quota"))
    assert d == ("quota_exceeded", "over quota", 403)
    bug = describe(KeyError("x"))
    assert bug.code == "internal" and bug.http_status == 500 and "KeyError" in bug.message


def test_codes_are_plain_strings_on_the_wire() -> None:
    e = StorageError(StorageCode.BUSY, "locked")
    assert e.code == "busy" and str(e.code) == "busy" and f"{e.code}" == "busy"
