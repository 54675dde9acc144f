"""The encrypted-file helpers of ``channels/matrix/crypto.py`` with values: a well-formed
EncryptedFile round-trips through the inbox's address form and decrypts; malformed or tampered
ones are refused, never fetched or decrypted wrongly."""

from __future__ import annotations

import pytest
from nio.crypto.attachments import encrypt_attachment
from nio.exceptions import EncryptionError

from channels.matrix.crypto import decrypt_file, file_source, split_source
from channels.matrix.downloads import media_path


def test_an_encrypted_file_travels_with_its_keys_and_decrypts() -> None:
    cipher, keys = encrypt_attachment(b"the plan")
    source = file_source({"file": {"url": "mxc://hs.example/abc123", **keys}})
    assert source is not None and source.startswith("mxc://hs.example/abc123#e2ee=")
    mxc, got = split_source(source)
    assert media_path(mxc) == "/_matrix/client/v1/media/download/hs.example/abc123" and got is not None
    assert decrypt_file(cipher, got) == b"the plan"
    with pytest.raises(EncryptionError):
        decrypt_file(cipher[:-1] + bytes([cipher[-1] ^ 1]), got)  # tampered: the hash does not match
    assert split_source("mxc://hs.example/plain") == ("mxc://hs.example/plain", None)


@pytest.mark.parametrize("file", [None, "x", {"url": "https://evil.example/x"}, {"url": "mxc://a/b"},
                                  {"url": "mxc://a/b", "key": {"k": 1}, "iv": "i", "hashes": {"sha256": "h"}},
                                  {"url": "mxc://a/b", "key": {"k": "k"}, "iv": "i", "hashes": {}}])
def test_a_malformed_encrypted_file_is_not_taken(file: object) -> None:
    assert file_source({"file": file}) is None


@pytest.mark.parametrize("fragment", ["!!!", "e30=", "WzFd"])  # not base64 JSON, {}, [1]
def test_unreadable_keys_are_an_error(fragment: str) -> None:
    with pytest.raises(ValueError):
        split_source(f"mxc://a/b#e2ee={fragment}")
