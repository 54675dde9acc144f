"""Matrix test helpers: settings for a Synapse account and the fake model, a running channel,
people who talk and wait for answers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from talon.config import Settings
from talon.runtime import Runtime
from tests.support.runtime import started
from tests.fakes.openai_server import FakeOpenAI
from tests.support.matrix_people import Person
from tests.support.synapse import Synapse


def matrix_settings(tmp_path: Path, synapse: Synapse, bot: Any, llm: FakeOpenAI, **extra: object) -> Settings:
    values: dict[str, object] = dict(
        MATRIX_HOMESERVER=synapse.base_url, MATRIX_USER_ID=bot.user_id, MATRIX_ACCESS_TOKEN=bot.access_token,
        OPENAI_BASE_URL=llm.base_url, OPENAI_API_KEY="test-key", TALON_MODEL="openai:fake-model",
        TALON_MEDIA_ROOT=str(tmp_path / "media_root"), TALON_DATA_DIR=str(tmp_path / "data"),
        TALON_MODEL_MAX_RETRIES=0, TALON_MODEL_TIMEOUT=30, TALON_ACK_DELAY=0,
        TALON_MATRIX_STREAM_INTERVAL=0.2,
    )
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[Runtime]:
    from channels.matrix import MatrixChannel

    async with started(settings, [MatrixChannel(settings)]) as runtime:
        yield runtime


@contextlib.contextmanager
def people(synapse: Synapse, *prefixes: str) -> Any:
    made = [Person(synapse.base_url, synapse.register(p)) for p in prefixes]
    try:
        yield made
    finally:
        for person in made:
            person.close()


async def joined(person: Person, room: str, user: str) -> None:
    await person.wait_for(room, lambda _: user in person.members(room), what=f"{user} to join")
