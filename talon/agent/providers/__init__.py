"""The model servers: ``base`` (the neutral contract every adapter maps to and from), ``openai``
(Chat Completions and compatible servers), ``anthropic`` (Messages API), ``local`` (llama.cpp
serving a GGUF file as a child process), ``discovery`` (asking a server what it serves),
``profiles`` (windows and capabilities), ``refusals`` (what an error body means), ``retries``
(the one retry loop), ``learned`` (what a server revealed, kept across restarts). Nothing is
imported here: an adapter's SDK loads only when that adapter is used."""
