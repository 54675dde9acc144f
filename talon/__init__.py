"""Talon: a chat-channel bridge for an LLM agent (Telegram, WhatsApp, console)."""

__version__ = "0.1.0"
