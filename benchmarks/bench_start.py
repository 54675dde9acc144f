"""Start-up: from spawning `talon chat` to its first answer, against a loopback model server.

Run: ``python benchmarks/bench_start.py``. Reports, measured in this run, the time to the first
answer relative to a bare ``python -c pass`` and what importing the Anthropic SDK alone would
add (Talon imports a provider's SDK only when its model is configured, so an ``openai:`` model
never pays it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.openai_server import FakeOpenAI  # noqa: E402


def _seconds(argv: list[str], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        best = min(best, time.perf_counter() - start)
    return best


async def _first_answer(base_url: str, work: Path) -> float:
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "k", "TALON_MODEL": "openai:fake-model",
           "TALON_MEDIA_ROOT": str(work / "media"), "TALON_DATA_DIR": str(work / "data"),
           "TALON_LOG_LEVEL": "WARNING"}
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "talon.cli", "chat", cwd=work, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"hello\n")
    await proc.stdin.drain()
    seen = b""
    while b"echo: hello" not in seen:
        chunk = await asyncio.wait_for(proc.stdout.read(4096), 60)
        if not chunk:
            raise RuntimeError(f"talon chat ended before answering: {seen[-500:]!r}")
        seen += chunk
    took = time.perf_counter() - start
    proc.stdin.close()
    await proc.wait()
    return took


async def main() -> None:
    bare = _seconds([sys.executable, "-c", "pass"])
    anthropic = _seconds([sys.executable, "-c", "import anthropic"]) - bare
    async with FakeOpenAI() as llm:
        answers = []
        for n in range(3):
            with tempfile.TemporaryDirectory() as tmp:
                answers.append(await _first_answer(llm.base_url, Path(tmp)))
    first = min(answers)
    print(f"python -c pass                      {bare:6.2f} s   1.0x")
    print(f"talon chat: start to first answer   {first:6.2f} s  {first / bare:4.1f}x")
    print(f"import anthropic alone (not paid)   {anthropic:6.2f} s  ({anthropic / first:.0%} of that start)")


if __name__ == "__main__":
    asyncio.run(main())
