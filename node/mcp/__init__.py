"""The node's MCP face.

``registry`` holds the one tool table (each tool a ``ToolSpec``: name, handler, family, schema, summary);
``validate`` checks a call's arguments against it; ``backend`` runs a call on a service in this process;
``socket`` is the node's local socket (framing, its server, and the client that forwards calls to it);
``server`` is the SDK server (stdio, streamable HTTP); ``profiles`` the tool families a session lists;
``capabilities`` and ``peers`` the live state the node shows, given the ``runtime`` when a node runs here.

Nothing is imported here, so the CLI reaches the socket client without loading the MCP SDK.
"""
