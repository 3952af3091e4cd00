"""Which JetStream answers make the gateway give a frame up (docs/gateway.md, "Frames"; issue 36).

A refusal is an answer about the message itself; an answer about the stream's state — 409
"duplicate message id is in process" from a leader that still holds an uncommitted copy (a
minority leader during a partition answers every resend so), 429 "too many requests", 503,
timeouts, no responders — is retried with the same message id until the frame is stored."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from services.gateway.publishing.publisher import describe, is_transient, refuses_the_message

IN_PROCESS = nats.js.errors.APIError(code=409, err_code=10158, description="duplicate message id is in process")


@pytest.mark.parametrize("error", [
    IN_PROCESS,
    nats.js.errors.APIError(code=409, description="duplicate message id is in process"),  # no err_code
    nats.js.errors.APIError(code=429, err_code=10167, description="too many requests"),
    nats.js.errors.APIError(code=503, description="JetStream system temporarily unavailable"),
    nats.js.errors.NoStreamResponseError(),
    nats.errors.TimeoutError(),
    TimeoutError(),
    ConnectionError("NATS is not connected"),
])
def test_an_answer_about_the_streams_state_is_never_a_refusal(error: Exception) -> None:
    assert not refuses_the_message(error)


@pytest.mark.parametrize("error", [
    nats.js.errors.APIError(code=400, err_code=10054, description="message size exceeds maximum allowed"),
    nats.js.errors.APIError(code=409, err_code=10071, description="wrong last sequence: 4"),
    nats.errors.MaxPayloadError(),
    nats.errors.BadSubjectError(),
])
def test_an_answer_about_the_message_is_a_refusal(error: Exception) -> None:
    assert refuses_the_message(error)
    assert not is_transient(error)


def test_a_jetstream_answer_is_described_with_its_codes_not_as_a_bare_apierror() -> None:
    # repr() of nats-py's APIError is "APIError()": the log said nothing of what JetStream meant.
    assert repr(IN_PROCESS) == "APIError()"
    assert describe(IN_PROCESS) == "APIError code=409 err_code=10158: duplicate message id is in process"
    assert describe(TimeoutError()) == "TimeoutError"
