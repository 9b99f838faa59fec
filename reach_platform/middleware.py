"""Request-wide middleware: every request gets an id (audit rows carry it), and answers under /api/ are JSON
whatever went wrong: Django's own 400/404/413/500 answers (and, with DEBUG on, its debug pages with settings,
paths and SQL) are replaced by the API's error body."""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.http import Http404, JsonResponse

from reach_platform import request_context
from reach_platform.errors import error_body

logger = logging.getLogger("reach_platform.errors")

API_PREFIX = ("/api/", "/a2a-push/")  # what answers JSON errors: the API and the A2A agents' push endpoint
_CODES = {400: "bad_request", 403: "forbidden", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
          500: "server_error"}


def _json_error(status: int, message: str) -> JsonResponse:
    return JsonResponse(error_body(_CODES.get(status, "error"), message), status=status)


class RequestIdMiddleware:
    """Binds the request's id (the caller's ``X-Request-Id`` when sane, else a fresh one) for the audit rows
    written while serving it, and answers with it in ``X-Request-Id``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request_id = request_context.request_id_from(request.headers.get("X-Request-Id"))
        token = request_context.bind(request_id)
        try:
            response = self.get_response(request)
        finally:
            request_context.unbind(token)
        response["X-Request-Id"] = request_id
        return response


class ApiJsonErrorsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (request.path.startswith(API_PREFIX) and response.status_code >= 400
                and not response.get("Content-Type", "").startswith("application/json")):
            return _json_error(response.status_code, response.reason_phrase or "Error")
        return response

    def process_exception(self, request, exception):
        if not request.path.startswith(API_PREFIX):
            return None
        if isinstance(exception, RequestDataTooBig):
            return _json_error(413, "The request body is over the size limit.")
        if isinstance(exception, SuspiciousOperation):
            return _json_error(400, "The request was refused as malformed.")
        if isinstance(exception, Http404):
            return _json_error(404, "Not found.")
        if isinstance(exception, PermissionDenied):
            return _json_error(403, "Permission denied.")
        log_unhandled(exception, path=request.path, method=request.method)
        return _json_error(500, "Internal error; it has been logged.")


def log_unhandled(exception: BaseException, *, path: str, method: str) -> None:
    """The exception's message may quote the request (a database error's DETAIL/CONTEXT carries a fragment of
    the statement's data): log its type and where it was raised, never its text."""
    logger.error("unhandled error in an API view", extra={
        "path": path, "method": method, "exc_type": type(exception).__qualname__, "at": _where(exception)})


def _where(exception: BaseException) -> list[str]:
    frames = []
    tb = exception.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(f"{code.co_filename.rsplit('/', 2)[-1]}:{tb.tb_lineno} {code.co_name}")
        tb = tb.tb_next
    return frames[-8:]
