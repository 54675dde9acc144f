"""A stopped Talon leaves no HTTP client of the speech APIs open.

With TALON_TRANSCRIBER=openai and TALON_TTS=openai, transcription and voice replies each hold an
OpenAI SDK client. Before this, the runtime's stop closed only their worker threads: the clients'
connections were collected later, after the event loop had closed, and asyncio reported "Task
exception was never retrieved ... Event loop is closed" into whatever ran next.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import make_settings, running_telegram
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

FOX = Path(__file__).parent / "fixtures" / "speech_fox.ogg"


async def test_stop_closes_the_speech_api_clients_after_they_were_used(
        tmp_path: Path, tg: FakeTelegram, llm: FakeOpenAI) -> None:
    llm.transcription_text = "the quick brown fox"
    settings = make_settings(tmp_path, tg.base_url, llm.base_url, TALON_TRANSCRIBER="openai",
                             TALON_TTS="openai", TALON_VOICE_REPLIES="mirror",
                             TALON_SPEECH_WARMUP="false")
    async with running_telegram(settings) as runtime:
        transcriber, synthesizer = runtime.transcriber, runtime.synthesizer
        assert transcriber is not None and transcriber.backend is not None
        assert synthesizer is not None and synthesizer.engine is not None
        # Both clients open a connection to the (loopback) API, as in a real turn.
        transcript = await transcriber.transcribe(FOX)
        note = await synthesizer.synthesize("Hello there.", language="en", max_seconds=10)
        clients = [transcriber.backend._client, synthesizer.engine._client]  # type: ignore[attr-defined]
        assert transcript.text == "the quick brown fox" and note.data
        assert len(llm.transcriptions) == 1 and len(llm.speech_requests) == 1
        assert not any(client.is_closed() for client in clients)
    assert all(client.is_closed() for client in clients)
