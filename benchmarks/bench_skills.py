"""CPU per message with 50 skills installed against none, side by side in one run.

Run: ``python benchmarks/bench_skills.py`` (under a minute). The agent answers messages in process
with the standard workspace tools and ``load_skill``, against a model that answers at once
(no network, no channel), so the figure is the agent's own work per message: loading the
session, building the system prompt and request, writing the log. That is the strictest
denominator: in a running Talon the channel and the HTTP call to the model add to every message,
the skills' cost does not grow with them.

Two setups, each with its own data directory and workspace:

- **none**: no shared skills directory, no ``skills/`` in the workspace;
- **50 skills**: 40 shared skills in a ``TALON_SKILLS_DIR`` and 10 in each chat's ``skills/``.

They alternate in rounds (none, 50, none, 50, ...) so drift on a busy machine hits both alike;
each round answers ``MESSAGES`` messages in fresh chats of ``PER_CHAT`` messages each, and the CPU
time of the process (all threads: ``time.process_time``) is divided by the messages. The figure is
the ratio of the medians; the bar (issue 31) is within 5%. A chat's first message also reads its
own skills once (about 70 microseconds a skill); that one-time cost is printed on its own, measured
on 100 fresh chats.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from talon.agent.loop import Agent  # noqa: E402
from talon.agent.providers.base import ModelRequest, ModelResponse, Provider, Usage  # noqa: E402
from talon.agent.providers.profiles import ModelProfile  # noqa: E402
from talon.agent.tools.skills import LoadSkillTool, SkillCatalog  # noqa: E402
from talon.agent.tools.workspace import Workspace  # noqa: E402
from talon.agent.tools.workspace_tools import workspace_tools  # noqa: E402
from talon.content import Message  # noqa: E402
from talon.storage.embedded.sessions import JsonlSessions  # noqa: E402
from talon.storage.sessions import ChatKey  # noqa: E402

MESSAGES = 200
PER_CHAT = 50


class Instant(Provider):
    name, model = "openai", "gpt-4o"

    def __init__(self) -> None:
        self.system_chars = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.system_chars = len(request.system)
        return ModelResponse(message=Message.assistant("Noted, thank you."), usage=Usage(1500, 5))


def write_skill(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: Handle requests about {name.replace('-', ' ')} the way this team does\n"
        f"---\n# {name}\n\n" + "Step. " * 300 + "\n")


def setup(base: Path, skills: int) -> tuple[Agent, Instant]:
    media = base / "media"
    shared = base / "shared"
    shared.mkdir(parents=True)
    provider = Instant()
    workspace = Workspace(media)
    tools = workspace_tools(workspace, store=None)
    catalog = SkillCatalog(shared if skills else None)
    tools.add(LoadSkillTool(catalog))
    agent = Agent(provider, JsonlSessions(base / "data"), tools=tools, workspace=workspace,
                  profile=ModelProfile(128_000, 8_000, True), skills=catalog,
                  workspaces=lambda chat: media / chat.chat_id)
    if skills:
        for i in range(skills - 10):
            write_skill(shared / f"shared-{i:02}", f"shared-skill-{i:02}")
    return agent, provider


async def round_of(agent: Agent, label: str, start: int, skills: int, base: Path) -> float:
    chats = MESSAGES // PER_CHAT
    if skills:  # the chat's own ten, in each chat's workspace, written before the clock starts
        for c in range(chats):
            for i in range(10):
                write_skill(base / "media" / f"{label}-{start + c}" / "skills" / f"own-{i}", f"own-skill-{i}")
    began = time.process_time()
    for c in range(chats):
        chat = ChatKey("bench", f"{label}-{start + c}")
        for m in range(PER_CHAT):
            await agent.run_turn(chat, Message.user(f"message {m} of the benchmark, please note it"), f"t{m}")
    return (time.process_time() - began) / MESSAGES


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-skills-") as tmp:
        none_agent, none_provider = setup(Path(tmp) / "none", 0)
        many_agent, many_provider = setup(Path(tmp) / "many", 50)
        # A first round each, unmeasured: imports, caches and the disk warm up.
        await round_of(none_agent, "warm", 0, 0, Path(tmp) / "none")
        await round_of(many_agent, "warm", 0, 50, Path(tmp) / "many")
        none: list[float] = []
        many: list[float] = []
        for r in range(rounds):
            none.append(await round_of(none_agent, f"r{r}", 0, 0, Path(tmp) / "none"))
            many.append(await round_of(many_agent, f"r{r}", 0, 50, Path(tmp) / "many"))
        listed = many_agent.system(ChatKey("bench", "r0-0")).text.count("\n- ")
        print(f"system prompt: {none_provider.system_chars:,} characters without skills, "
              f"{many_provider.system_chars:,} with 50 ({listed} listed)")
        for name, values in (("none", none), ("50 skills", many)):
            print(f"{name:>10}: CPU per message {statistics.median(values) * 1000:.3f} ms "
                  f"(rounds: {', '.join(f'{v * 1000:.3f}' for v in values)})")
        catalog = many_agent.skills
        assert catalog is not None
        base = Path(tmp) / "many" / "media"
        began = time.process_time()
        for c in range(100):
            catalog.refresh(base / f"first-{c}")
        empty = (time.process_time() - began) / 100
        for c in range(100):
            for i in range(10):
                write_skill(base / f"first-own-{c}" / "skills" / f"own-{i}", f"own-skill-{i}")
        began = time.process_time()
        for c in range(100):
            catalog.refresh(base / f"first-own-{c}")
        first = (time.process_time() - began) / 100
        print(f"a chat's first look at its skills: {first * 1000:.3f} ms with 10 of its own, "
              f"{empty * 1000:.3f} ms with none (once per chat while it is active)")
        ratio = statistics.median(many) / statistics.median(none)
        print(f"ratio 50 skills / none: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%; the bar is within 5%)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    asyncio.run(main(parser.parse_args().rounds))
