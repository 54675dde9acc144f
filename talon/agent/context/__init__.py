"""What the model sees: ``pipeline`` (the per-request transforms of the conversation), ``summary``
(summaries of old turns and their archive), ``memory`` (the system prompt and AGENTS.md),
``session`` (checkpoint and failed-turn records), ``tokens`` (estimates), ``memo`` (values
derived from a message, remembered). Nothing is imported here."""
