"""Speech: voice notes in (to text) and voice notes out (from text).

    transcribe     speech to text: PyAV decodes a recording, a Whisper backend turns it into words
    synthesize     text to speech: a reply's prose becomes an OGG/Opus voice note (Piper or OpenAI)
    voice_replies  when an answer also goes back as a voice note, what is spoken, the ``speak`` tool
    cpu_pool       the bounded thread pool both engines run their CPU-heavy work in

Import from the modules themselves (``from talon.speech.transcribe import Transcriber``); this
package re-exports nothing, so importing one part never loads the others.
"""
