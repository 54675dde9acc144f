"""Voice replies: when an answer also goes back as a voice note, what is spoken, and the tool.

When (``TALON_VOICE_REPLIES``):

    mirror  (default) an answer to a voice note gets a voice note too; so does an answer the
            agent chose to speak with the ``speak`` tool (the person asked for one)
    always  every answer gets a voice note
    off     never; the ``speak`` tool is not offered

The text of the answer is always delivered first, as usual, and the voice note follows: the
synthesis (``talon.speech.synthesize``) starts as soon as the answer exists and runs in its own
bounded pool while the text is being sent, so the text never waits for speech and a failure costs
only the voice note, reported in one line. What is spoken is the prose (``speakable_text``): code blocks,
inline code (unless it is one plain word), tables, URLs and file paths stay in the text message
only. A voice note is made only
when a voice speaks the language the person's note was in; otherwise the answer stays text, with
no error.
"""

from __future__ import annotations

import asyncio
import logging
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from talon.storage.sessions import safe_path_part
from talon.agent.tools.registry import Tool, ToolResult
from talon.bounded import BoundedMap
from talon.content import InboundKind, Message
from talon.envelope import InboundMessage, OutboundReply, VoiceWish
from talon.media.outbound import MarkdownMediaRef
from talon.render.markdown import Code, CodeBlock, Delim, Link, QuoteBlock, Text, Token, Url, iter_blocks, parse_inline
from talon.speech.transcribe import Transcript, format_duration, language_name
from talon.errors import SpeechUnavailable, SynthesisError, ToolError, UnsafePath
from talon.safe_files import atomic_write_beneath
from talon.speech.synthesize import Synthesizer, VoiceNote, primary_language

log = logging.getLogger(__name__)

SPEAK_TOOL = "speak"
VOICE_ALT = "voice reply"
# Where voice notes are written, under the media root (the only root outbound files come from).
VOICE_DIR = "outbox/voice"

_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
_THEMATIC_BREAK = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+")
_LIST_MARK = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+")
_WWW = re.compile(r"\bwww\.[^\s<>]+", re.IGNORECASE)
_EMAIL_OR_URLISH = re.compile(r"\b[\w.+-]+@[\w-]+\.[\w.-]+\b|\b\w+://\S+")
# A file path: something/with/slashes.ext, or a bare name with a file extension people write.
_PATH = re.compile(r"(?<![\w@])(?:~?/)?(?:[\w.-]+/)+[\w.-]*\w|(?<![\w@/])[\w-]+\.(?:png|jpe?g|gif|webp|"
                   r"svg|pdf|csv|tsv|txt|md|json|ya?ml|toml|ini|py|js|ts|sh|html?|css|xml|zip|tar|gz|"
                   r"ogg|opus|mp3|m4a|wav|mp4|mov|docx?|xlsx?|pptx?|log)\b", re.IGNORECASE)
_WORDY_CODE = re.compile(r"[A-Za-z][A-Za-z-]{0,30}")  # one plain word
_HTML_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
_EMPTY_BRACKETS = re.compile(r"\(\s*[,;:]?\s*\)|\[\s*\]")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")
_REPEATED_PUNCT = re.compile(r"([,;:])(\s*[,;:])+")
_SPACES = re.compile(r"[ \t]+")
_ENDS_SENTENCE = re.compile(r"[.!?…。！？:;]$")


@dataclass(frozen=True)
class Speakable:
    """The prose of an answer as plain text for a voice, and what was kept out of it."""

    text: str
    left_out: tuple[str, ...] = ()  # "code", "table", "link", "file"


def speakable_text(markdown: str) -> Speakable:
    """What a voice should say for ``markdown``: the prose, one sentence per line.

    Code blocks, inline code (except a plain word such as `requests`), tables, URLs (bare,
    autolinked or as a link's target), HTML, file paths, emoji and markup are not spoken; a link
    speaks its text. Pure and deterministic.
    """
    left_out: set[str] = set()
    lines: list[str] = []
    for block in iter_blocks(markdown):
        if isinstance(block, CodeBlock):
            left_out.add("code")
            continue
        raw_lines = block.lines if isinstance(block, QuoteBlock) else [block.text]
        for raw in raw_lines:
            spoken = _speak_line(raw, left_out)
            if spoken:
                lines.append(spoken)
    return Speakable("\n".join(lines), tuple(sorted(left_out)))


def _speak_line(line: str, left_out: set[str]) -> str:
    stripped = line.strip()
    if not stripped or _THEMATIC_BREAK.match(stripped):
        return ""
    if stripped.startswith("|") or _TABLE_RULE.match(stripped):
        left_out.add("table")
        return ""
    line = _LIST_MARK.sub("", _HEADING.sub("", line))
    text = "".join(_speak_token(token, left_out) for token in parse_inline(line))
    if _HTML_TAG.search(text):
        text = _HTML_TAG.sub(" ", text)
    for pattern, what in ((_WWW, "link"), (_EMAIL_OR_URLISH, "link"), (_PATH, "file")):
        text, n = pattern.subn("", text)
        if n:
            left_out.add(what)
    text = "".join(ch for ch in text if not _is_symbol(ch))
    text = _EMPTY_BRACKETS.sub("", text)
    text = _REPEATED_PUNCT.sub(r"\1", _SPACE_BEFORE_PUNCT.sub(r"\1", _SPACES.sub(" ", text))).strip()
    text = text.strip(" ,;:-–—")  # a line cut down to its punctuation says nothing
    if not any(ch.isalnum() for ch in text):
        return ""
    # Every line ends a sentence, so the voice pauses where the reader's eye would.
    return text if _ENDS_SENTENCE.search(text) else text + "."


def _speak_token(token: Token, left_out: set[str]) -> str:
    if isinstance(token, Text):
        return token.text
    if isinstance(token, Link):
        if token.image:
            left_out.add("file")
            return ""
        plain = token.plain()
        left_out.add("link")
        return "" if not plain or plain == token.url or "://" in plain else plain
    if isinstance(token, Delim):  # emphasis markers, paired or stray, are never spoken
        return ""
    if isinstance(token, Code) and _WORDY_CODE.fullmatch(token.text.strip()):
        return token.text.strip()  # "the `requests` library": a name, said as a word
    left_out.add("link" if isinstance(token, Url) else "code")
    return ""


def _is_symbol(ch: str) -> bool:
    """Emoji, pictographs and their joiners: a voice would read their names aloud."""
    if ch in "\u200d\ufe0f\ufe0e":
        return True
    return unicodedata.category(ch) in ("So", "Cs", "Co")


# --- the turn's wish -----------------------------------------------------------------------------


def speak_calls(messages: list[Message]) -> list[dict[str, Any]]:
    """The arguments of this turn's successful ``speak`` tool calls, in order."""
    failed = {m.tool_call_id for m in messages if m.role == "tool" and m.meta.get("error")}
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    calls: list[dict[str, Any]] = []
    for message in messages:
        for call in message.tool_calls or []:
            if call.name == SPEAK_TOOL and call.id in answered and call.id not in failed:
                try:
                    args = call.parsed_arguments()
                except ValueError:
                    args = {}
                calls.append(args)
    return calls


@dataclass
class VoiceReplies:
    """Decides which answers are spoken and makes their voice notes (see the module docstring)."""

    synthesizer: Synthesizer
    media_root: Path
    mode: str = "mirror"
    max_seconds: float = 120.0
    # Longest a voice note may take to make before the person gets a note instead.
    timeout_s: float = 120.0
    # The conversation's own workspace (TALON_WORKSPACE=chat), where its voice notes are written
    # so that its outbound containment lets them out; None: ``media_root`` for every chat.
    workspace: Callable[[InboundMessage], Path] | None = None
    # Language heard in each message's voice note, by message key, until its turn reads it.
    _heard: BoundedMap[str, str | None] = field(default_factory=lambda: BoundedMap("voice_heard"))
    notes_made: int = 0

    # --- intake: what was heard -------------------------------------------------------------
    def heard(self, message: InboundMessage, kind: InboundKind, transcript: Transcript) -> None:
        """Called by the normalizer for each transcript; the first voice note's language counts."""
        if kind in ("voice", "audio", "video_note"):
            self._heard.setdefault(message.key, primary_language(transcript.language))

    def forget(self, message: InboundMessage) -> None:
        self._heard.pop(message.key, None)

    # --- deciding ----------------------------------------------------------------------------
    def wish(self, message: InboundMessage, turn: list[Message]) -> VoiceWish | None:
        """Whether this answer should also be spoken, and in which language; None for text only."""
        heard = self._heard.pop(message.key, None)
        asked = speak_calls(turn)
        voice_in = any(f.kind == "voice" for f in message.files)
        if self.mode == "off" or not (self.mode == "always" or voice_in or asked):
            return None
        language = next((primary_language(str(a["language"])) for a in reversed(asked)
                         if a.get("language")), None) or heard
        if self.synthesizer.available and not self.synthesizer.can_speak(language):
            # No voice for that language: the answer stays text, with no error.
            log.info("voice reply for %s not made: no voice speaks %s (voices: %s)", message.key,
                     language_name(language), ", ".join(self.synthesizer.languages))
            return None
        return VoiceWish(language=language, asked=bool(asked))

    # --- making ------------------------------------------------------------------------------
    async def make(self, message: InboundMessage, reply: OutboundReply) -> OutboundReply | None:
        """The voice note for ``reply`` as a reply of its own (one voice file), or a reply with
        one line saying why it could not be made. None when the answer has no prose to speak."""
        wish = reply.voice
        if wish is None:
            return None
        ids = f"channel={message.channel} chat={message.chat_id} message={message.message_id}"
        try:
            speakable = speakable_text(reply.text)
            if not speakable.text.strip():
                log.info("%s: no voice reply: the answer has no prose to speak", ids)
                return None
            note = await asyncio.wait_for(
                self.synthesizer.synthesize(speakable.text, language=wish.language,
                                            max_seconds=self.max_seconds),
                self.timeout_s)
            path = await asyncio.to_thread(self._write, message, note)
        except TimeoutError:
            log.error("%s: voice reply took over %.0fs; sending text only", ids, self.timeout_s)
            return OutboundReply(text="", notices=["(No voice note for this answer: making it took too long.)"])
        except Exception as exc:
            log.error("%s: voice reply could not be made: %s", ids, exc)
            return OutboundReply(text="", notices=[f"(No voice note for this answer: {_reason(exc)})"])
        self.notes_made += 1
        log.info("%s: voice reply %s, %.1fs of speech made in %.2fs (real-time factor %.2f)", ids,
                 path.name, note.duration_s, note.synth_s, note.real_time_factor)
        notices = []
        if note.rest:
            notices.append(f"(The voice note speaks the first {format_duration(note.duration_s)}; "
                           "the rest is in the text above.)")
        ref = MarkdownMediaRef(alt=VOICE_ALT, path=path.relative_to(self._root(message)).as_posix())
        return OutboundReply(text="", media=[ref], notices=notices)

    def _root(self, message: InboundMessage) -> Path:
        return self.workspace(message) if self.workspace is not None else self.media_root

    def _write(self, message: InboundMessage, note: VoiceNote) -> Path:
        # The workspace is the agent's: any folder on the way or the file's name may be a link it
        # planted, so the note is written link-free beneath the root (talon.safe_files).
        root = self._root(message)
        parts = VOICE_DIR.split("/")
        if self.workspace is None:
            parts += [safe_path_part(message.channel), safe_path_part(message.chat_id)]
        name = f"reply-{safe_path_part(message.message_id)}.ogg"
        atomic_write_beneath(root, [*parts, name], note.data)
        return root.joinpath(*parts, name)


def _reason(exc: BaseException) -> str:
    """Why, in words for the chat: settings and host paths stay in the log."""
    if isinstance(exc, SpeechUnavailable):
        return "the voice cannot be used on this server (its log says why)."
    if isinstance(exc, UnsafePath):
        return f"it was not written, because {VOICE_DIR} in the workspace is or holds a symbolic link."
    if isinstance(exc, SynthesisError):
        text = str(exc).strip() or "speech synthesis failed"
    else:
        text = f"speech synthesis failed ({type(exc).__name__})"
    text = text if len(text) <= 160 else text[:157] + "..."
    return text if text.endswith(".") else text + "."


# --- the speak tool ------------------------------------------------------------------------------


class SpeakTool(Tool):
    """Lets the agent answer with a voice note when the person asks for one."""

    name = SPEAK_TOOL
    description = (
        "Also send your final answer to the current message as a voice note, spoken by a local "
        "voice. Use it when the person asks to hear the answer (\"answer with a voice message\"). "
        "Call it, then write your answer as usual: its prose is spoken; code, tables, links and "
        "file paths stay in the text message. Answers to voice notes are spoken without it."
    )
    parameters = {
        "type": "object",
        "properties": {
            "language": {
                "type": "string",
                "description": "ISO 639-1 code of the language your answer is in (e.g. en, es); "
                               "default: the language of the person's voice note, else the default voice's.",
            },
        },
        "required": [],
    }

    def __init__(self, synthesizer: Synthesizer) -> None:
        self.synthesizer = synthesizer

    async def run(self, args: dict[str, Any]) -> ToolResult:
        if not self.synthesizer.available:
            raise ToolError(f"voice notes cannot be made here: {self.synthesizer.unavailable_reason}; answer in text")
        language = args.get("language")
        if language is not None and not isinstance(language, str):
            raise ToolError("language must be an ISO 639-1 code such as 'en'")
        code = primary_language(language) if language else None
        if not self.synthesizer.can_speak(code):
            voices = ", ".join(language_name(lang) or lang for lang in self.synthesizer.languages)
            raise ToolError(f"no voice speaks {language_name(code)} here (voices: {voices}); answer in text")
        return ToolResult.text("OK: your final answer to this message will also be sent as a voice note.")


__all__ = [
    "SPEAK_TOOL",
    "SpeakTool",
    "Speakable",
    "VOICE_ALT",
    "VoiceReplies",
    "speak_calls",
    "speakable_text",
]
