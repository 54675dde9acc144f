"""The WhatsApp package's pure parts: template settings, template variables, the stored form of
waiting parts, approval-button payloads, the doctor row, media limits."""

from __future__ import annotations

import pytest

from channels.whatsapp.intake import button_press
from channels.whatsapp.parts import (ApprovalPart, MediaPart, NoticePart, ReplyDocumentPart, TextPart, part_json,
                                     part_of)
from channels.whatsapp.templates import VARIABLE_MAX, Templates, fit_variable, parse_template
from talon.config import Settings
from talon.doctor_checks import whatsapp_templates_row
from talon.errors import ConfigError, MalformedWebhook
from talon.media import MarkdownMediaRef

SID = "HX" + "0123456789abcdef" * 2


def test_a_template_setting_is_a_content_sid_and_optional_json_variables() -> None:
    assert parse_template("reopen", "") is None
    t = parse_template("reopen", f'  {SID}   {{"1": "Talon"}} ')
    assert t is not None and t.sid == SID and t.variables == {"1": "Talon"}
    assert t.content() == (SID, '{"1": "Talon"}')
    assert parse_template("approval", SID).content() == (SID, "")  # type: ignore[union-attr]
    for bad in ("HX123", "MG" + "0" * 32, f"{SID} [1]", f'{SID} {{"1": 2}}', f'{SID} {{"1": "a\\nb"}}',
                f'{SID} {{"1": "{"x" * (VARIABLE_MAX + 1)}"}}',
                SID + " {" + ", ".join(f'"{i}": "v"' for i in range(101)) + "}"):
        with pytest.raises(ConfigError) as err:
            parse_template("reminder", bad)
        assert "TALON_WHATSAPP_TEMPLATE_REMINDER" in str(err.value)


def test_a_reminder_carries_the_task_when_it_fits_else_the_reopen_template_goes() -> None:
    reopen, reminder = parse_template("reopen", SID), parse_template("reminder", "HX" + "f" * 32 + ' {"2": "{text}"}')
    templates = Templates(reopen, reminder, None)
    chosen = templates.for_closed_window("water\nthe   plants")
    assert chosen is not None and chosen[0] is reminder and chosen[1] == {"2": "water / the plants"}
    assert templates.for_closed_window("x" * 5000)[0] is reopen  # type: ignore[index]
    assert templates.for_closed_window(None)[0] is reopen  # type: ignore[index]
    assert Templates(None, None, None).for_closed_window("anything") is None
    assert Templates(None, reminder, None).missing_notice() is not None
    assert fit_variable("  \n ") is None and fit_variable("a\tb\r\nc") == "a b / c"


def test_waiting_parts_read_back_as_they_were_and_unknown_ones_are_none() -> None:
    parts = [TextPart("*hi*"), NoticePart("note"), MediaPart(MarkdownMediaRef(alt="a", path="out/x.png"), "cap"),
             ReplyDocumentPart("# long", "see reply.md"), ApprovalPart("ap1", "run `ls`?")]
    for part in parts:
        assert part_of(part_json(part)) == part
    for junk in ("", "[]", '{"kind": "exec", "cmd": "rm -rf /"}', '{"kind": "text"}', "{"):
        assert part_of(junk) is None


def test_button_payloads() -> None:
    assert button_press({"Body": "yes"}) is None
    assert button_press({"ButtonPayload": "menu:1"}) is None  # another template's button: a message
    press = button_press({"ButtonPayload": "approve:" + "a" * 32, "ButtonText": "Approve"})
    assert press is not None and press.choice == "approve" and press.token == "a" * 32
    for bad in ("approve:", "deny:" + "x" * 65, "approve:a b c d e f g h i j", "deny:<b>" + "a" * 20):
        with pytest.raises(MalformedWebhook):
            button_press({"ButtonPayload": bad})


def test_the_doctor_names_the_templates_or_what_is_missing() -> None:
    s = Settings(_env_file=None, TALON_WHATSAPP_TEMPLATE_APPROVAL=SID)  # type: ignore[call-arg]
    name, value = whatsapp_templates_row(s)
    assert name == "whatsapp templates" and value.startswith("WARNING") and f"approval {SID}" in value
    s = Settings(_env_file=None, TALON_WHATSAPP_TEMPLATE_REOPEN=SID)  # type: ignore[call-arg]
    assert whatsapp_templates_row(s)[1] == f"ok: reopen {SID}"
    s = Settings(_env_file=None, TALON_WHATSAPP_TEMPLATE_REOPEN="HXbad")  # type: ignore[call-arg]
    assert whatsapp_templates_row(s)[1].startswith("FAILED")


def test_documents_may_be_larger_than_media() -> None:
    from talon.config import MB, Limits

    limits = Limits()
    assert limits.whatsapp_document_max_bytes == 100 * MB and limits.whatsapp_media_max_bytes == 16 * MB


def test_a_document_may_be_up_to_100_mb_and_a_video_up_to_16() -> None:
    from types import SimpleNamespace

    from channels.whatsapp.media import fit_for_whatsapp
    from talon.config import MB, Limits
    from talon.errors import MediaTooLarge

    def media(kind: str, mime: str, size: int) -> object:
        return SimpleNamespace(kind=kind, mime=mime, size=size, name=f"f.{mime.split('/')[1]}")

    limits = Limits()
    assert fit_for_whatsapp(media("document", "application/pdf", 60 * MB), limits).kind == "document"  # type: ignore[arg-type]
    with pytest.raises(MediaTooLarge, match="100 MB limit for a document"):
        fit_for_whatsapp(media("document", "application/pdf", 101 * MB), limits)  # type: ignore[arg-type]
    assert fit_for_whatsapp(media("video", "video/mp4", 15 * MB), limits).kind == "video"  # type: ignore[arg-type]
    with pytest.raises(MediaTooLarge, match="16 MB limit for media"):
        fit_for_whatsapp(media("video", "video/mp4", 17 * MB), limits)  # type: ignore[arg-type]
