"""The fake Twilio's WhatsApp window, Content templates and status callbacks, driven by the real
twilio client: what Talon's tests rely on behaves as Twilio documents it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from aiohttp import web
from twilio.base.exceptions import TwilioRestException
from twilio.request_validator import RequestValidator
from twilio.rest import Client

from tests.fakes import LoopbackServer
from tests.fakes.twilio import FakeTwilio

ALICE = "whatsapp:+15550001111"
SID = "HX" + "0" * 32


class Receiver(LoopbackServer):
    """Where the fake posts status callbacks: records each form and its signature."""

    def __init__(self) -> None:
        super().__init__()
        self.got: list[tuple[str, dict[str, str], str]] = []

    def _make_app(self) -> web.Application:
        app = web.Application()

        async def handle(request: web.Request) -> web.Response:
            form = {k: str(v) for k, v in (await request.post()).items()}
            with self._cond:
                self.got.append((request.path, form, request.headers.get("X-Twilio-Signature", "")))
            self._notify()
            return web.Response(text="<Response/>", content_type="text/xml")

        app.router.add_post("/{tail:.*}", handle)
        return app

    def wait_for(self, n: int) -> list[tuple[str, dict[str, str], str]]:
        def check() -> list[tuple[str, dict[str, str], str]] | None:
            with self._cond:
                return list(self.got) if len(self.got) >= n else None

        return self._wait_until_sync(check, 20.0, lambda: f"waited for {n} callbacks; got {self.got}")


@pytest.fixture
def twilio() -> Iterator[FakeTwilio]:
    with FakeTwilio() as fake:
        yield fake


def client(fake: FakeTwilio) -> Client:
    c = Client(fake.account_sid, fake.auth_token, environment={"TALON": "1"})
    c.api.base_url = fake.base_url
    return c


def test_a_closed_window_refuses_free_form_with_63016_but_takes_templates(twilio: FakeTwilio) -> None:
    c = client(twilio)
    twilio.close_window(ALICE)
    with pytest.raises(TwilioRestException) as err:
        c.messages.create(to=ALICE, from_=twilio.whatsapp_from, body="hello")
    assert err.value.code == 63016 and err.value.status == 400
    sent = c.messages.create(to=ALICE, from_=twilio.whatsapp_from, content_sid=SID,
                             content_variables=json.dumps({"1": "Talon"}))
    assert sent.sid.startswith("SM")
    [template] = twilio.sent(to=ALICE)
    assert template.content_sid == SID and template.content_variables == {"1": "Talon"}
    twilio.inbound_params(ALICE, "hi")  # the person writes: open again
    assert c.messages.create(to=ALICE, from_=twilio.whatsapp_from, body="hello").sid.startswith("SM")


@pytest.mark.parametrize(("fields", "code"), [
    ({"content_variables": '{"1": "x"}'}, 21654),  # variables without a template
    ({"content_sid": "HX123"}, 21655),
    ({"content_sid": SID, "content_variables": "not json"}, 21656),
    ({"content_sid": SID, "content_variables": json.dumps({"1": "x" * 1025})}, 21656),
    ({"content_sid": SID, "content_variables": json.dumps({str(i): "v" for i in range(101)})}, 21656),
    ({"content_sid": SID, "content_variables": json.dumps({"1": 5})}, 21656),
])
def test_malformed_template_sends_are_refused(twilio: FakeTwilio, fields: dict[str, str], code: int) -> None:
    with pytest.raises(TwilioRestException) as err:
        client(twilio).messages.create(to=ALICE, from_=twilio.whatsapp_from, **fields)
    assert err.value.code == code


def test_status_callbacks_are_signed_for_the_public_url_and_posted_locally(twilio: FakeTwilio) -> None:
    with Receiver() as receiver:
        public = "https://talon.example.test"
        twilio.callbacks_to(public, receiver.root_url)
        twilio.statuses_next("sent", "undelivered", error_code=63016)
        sent = client(twilio).messages.create(to=ALICE, from_=twilio.whatsapp_from, body="hi",
                                              status_callback=public + "/twilio/whatsapp/status")
        receiver.wait_for(2)
    validator = RequestValidator(twilio.auth_token)
    for path, form, signature in receiver.got:
        assert path == "/twilio/whatsapp/status" and form["MessageSid"] == sent.sid
        assert validator.validate(public + path, form, signature)
    assert [f["MessageStatus"] for _, f, _ in receiver.got] == ["sent", "undelivered"]
    assert receiver.got[1][1]["ErrorCode"] == "63016" and "ErrorCode" not in receiver.got[0][1]
    assert [c.answered for c in twilio.wait_for_callbacks_sync(2)] == [200, 200]
