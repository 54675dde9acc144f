"""Providers are imported only when used: an `openai:` model never loads the Anthropic SDK."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import json, sys
from talon.config import Settings
from talon.runtime import build_runtime
settings = Settings(_env_file=None, TALON_MODEL=sys.argv[1], OPENAI_API_KEY="k", ANTHROPIC_API_KEY="k",
                    TALON_MEDIA_ROOT=sys.argv[2] + "/media", TALON_DATA_DIR=sys.argv[2] + "/data")
runtime = build_runtime(settings)
print(json.dumps({name: name in sys.modules for name in ("anthropic", "openai")}))
"""


def _loaded(model: str, tmp_path: Path) -> dict[str, bool]:
    done = subprocess.run([sys.executable, "-c", PROBE, model, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_only_the_configured_providers_sdk_is_imported(tmp_path: Path) -> None:
    assert _loaded("openai:gpt-4.1-mini", tmp_path / "a") == {"anthropic": False, "openai": True}
    assert _loaded("anthropic:claude-sonnet-4-5", tmp_path / "b")["anthropic"] is True
