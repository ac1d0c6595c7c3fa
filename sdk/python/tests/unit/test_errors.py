import json

import pytest

import corral
from corral import _errors


def body(code, message="m"):
    return json.dumps({"error": {"code": code, "message": message}}).encode()


@pytest.mark.parametrize(
    "code,cls",
    [
        ("invalid_argument", corral.InvalidArgument),
        ("not_found", corral.NotFound),
        ("already_exists", corral.AlreadyExists),
        ("failed_precondition", corral.FailedPrecondition),
        ("resource_exhausted", corral.ResourceExhausted),
        ("busy", corral.Busy),
        ("unavailable", corral.Unavailable),
        ("unauthenticated", corral.Unauthenticated),
        ("permission_denied", corral.PermissionDenied),
        ("not_implemented", corral.Unimplemented),
        ("internal", corral.Internal),
    ],
)
def test_every_code_has_its_class(code, cls):
    err = _errors.error_from_response(418, body(code, "why"), None)
    assert type(err) is cls
    assert isinstance(err, corral.CorralError)
    assert err.code == code and err.message == "why" and err.status == 418
    assert str(err) == f"why ({code})"


def test_retry_after_header():
    err = _errors.error_from_response(503, body("busy"), "7")
    assert isinstance(err, corral.Busy) and err.retry_after == 7.0
    assert _errors.error_from_response(503, body("busy"), "soon").retry_after is None
    assert _errors.error_from_response(503, body("busy"), None).retry_after is None


@pytest.mark.parametrize(
    "status,cls",
    [(400, corral.InvalidArgument), (401, corral.Unauthenticated), (404, corral.NotFound), (409, corral.FailedPrecondition),
     (429, corral.ResourceExhausted), (502, corral.Unavailable), (501, corral.Unimplemented), (500, corral.Internal)],
)
def test_answer_without_error_body_is_named_by_status(status, cls):
    err = _errors.error_from_response(status, b"<html>proxy says no</html>", None)
    assert type(err) is cls
    assert "proxy says no" in err.message


def test_unknown_code_keeps_its_name():
    err = _errors.error_from_response(500, body("brand_new"), None)
    assert type(err) is corral.CorralError and err.code == "brand_new"


def test_stream_error_detail():
    err = _errors.error_from_detail({"code": "not_found", "message": "no such program"}, "x")
    assert isinstance(err, corral.NotFound) and err.status == 200
    assert isinstance(_errors.error_from_detail(None, "fallback"), corral.Internal)
