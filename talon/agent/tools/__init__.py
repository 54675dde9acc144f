"""The agent's tools: ``registry`` (named tools with a JSON schema, run by the loop), the workspace
and its file tools (``workspace``, ``workspace_tools``, ``file_readers``, ``beneath``), the shell's
``sandbox``, MCP servers (``mcp``, ``mcp_config``, ``mcp_launch``, ``mcp_stdio``), ``web_fetch``
and its ``html_worker``, and ``untrusted`` (marking outside text). Nothing is imported here."""
