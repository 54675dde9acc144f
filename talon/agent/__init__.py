"""The agent: one turn of a conversation with a model, platform-free.

``loop`` runs the turn and ``hooks`` is what the bridge lends it (the guard around every model
call, the gate before every tool call). Beneath them: ``context`` (what the model sees: the
pipeline, summaries, the system prompt and memory, session records, token estimates),
``providers`` (the model servers: the contract, OpenAI-compatible, Anthropic, local llama.cpp,
discovery, profiles, refusals, retries) and ``tools`` (the registry and every tool: workspace
files, the sandboxed shell, MCP, web fetch). Nothing is imported here: each module is imported
where it is used, so idle Talon loads only what it needs.
"""
