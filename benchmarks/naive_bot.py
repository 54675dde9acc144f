"""The naive bot bench_cpu_per_message.py measures Talon against: what a person writes in 30 lines.

python-telegram-bot polling, the openai SDK, one history list per chat in memory, no streaming,
no storage; only its timeouts are generous, so a loaded machine loses no message. Configured by
the environment: TELEGRAM_BOT_TOKEN, TELEGRAM_API_BASE_URL, OPENAI_BASE_URL, OPENAI_API_KEY, MODEL.
"""

import os

from openai import AsyncOpenAI
from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
histories: dict[int, list[dict[str, str]]] = {}


async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.message is not None and update.message.text is not None
    history = histories.setdefault(update.message.chat_id, [])
    history.append({"role": "user", "content": update.message.text})
    completion = await client.chat.completions.create(model=os.environ["MODEL"], messages=history)  # type: ignore[arg-type]
    text = completion.choices[0].message.content or ""
    history.append({"role": "assistant", "content": text})
    await update.message.reply_text(text)


if __name__ == "__main__":
    app = (Application.builder().token(os.environ["TELEGRAM_BOT_TOKEN"])
           .base_url(os.environ["TELEGRAM_API_BASE_URL"] + "/bot").concurrent_updates(True)
           .connect_timeout(30).read_timeout(30).write_timeout(30).pool_timeout(30).build())  # a loaded machine loses nothing
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, answer))
    app.run_polling()
