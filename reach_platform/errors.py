"""One family of domain errors, mapped to clear 4xx JSON by the DRF exception handler.

Services raise these; views never build error responses by hand. Every error body is
``{"error": {"code": ..., "message": ..., "details": ...}}``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response


class ApplicationError(Exception):
    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, details: Any = None, code: str | None = None, headers=None):
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers or {}
        if code:
            self.code = code


class NotFound(ApplicationError):
    status_code = 404
    code = "not_found"


class PermissionDenied(ApplicationError):
    status_code = 403
    code = "forbidden"


class Conflict(ApplicationError):
    status_code = 409
    code = "conflict"


class InvalidInput(ApplicationError):
    status_code = 400
    code = "invalid"


class TooManyRequests(ApplicationError):
    status_code = 429
    code = "too_many_requests"

    def __init__(self, message: str, *, retry_after: float = 1.0, **kwargs):
        super().__init__(message, **kwargs)
        self.retry_after = max(1, int(round(retry_after + 0.499)))
        self.headers["Retry-After"] = str(self.retry_after)


class PaymentRequired(ApplicationError):
    status_code = 402
    code = "budget_exceeded"


def error_body(code: str, message: str, details: Any = None) -> dict:
    error = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    return {"error": error}


def exception_handler(exc, context):
    # imported here: DRF's views module loads the default parser (reach_platform.jsonsafe), which imports this one
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, ApplicationError):
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.status_code, headers=exc.headers)
    if isinstance(exc, DjangoValidationError):
        return Response(error_body("invalid", "; ".join(exc.messages), getattr(exc, "message_dict", None)), status=400)
    if isinstance(exc, Http404):
        return Response(error_body("not_found", str(exc) or "Not found."), status=404)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, drf_exceptions.ValidationError):
        response.data = error_body("invalid", "The request body is not valid.", exc.detail)
    elif isinstance(exc, drf_exceptions.ParseError):
        response.data = error_body("bad_json", f"The request body is not valid JSON: {exc.detail}")
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = error_body(getattr(exc, "default_code", "error"), str(detail))
    return response
