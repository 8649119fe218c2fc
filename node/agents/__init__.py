"""Agents as principals: each local MCP client its own signed identity, vouched for by its node (docs/security.md,
"Agents"). ``acting`` names the principal a call runs as; ``verdict`` decides an agent's signature (pure);
``book`` reads the delegations a node holds; ``local`` makes and ends this node's own agents."""
