"""Permissions and approvals (docs/permissions.md): rules (pure), the gate every write passes through."""
