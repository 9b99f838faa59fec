"""A small Python client for the Agent-Reach API.

    from reach_platform.client import ReachClient
    client = ReachClient("http://127.0.0.1:8000", token)
    task = client.invoke(task="where is my order 12345", payload={"order_id": "12345"})
    print(task["status"], task["result"])
"""

from __future__ import annotations

from typing import Any

import httpx


class ReachError(Exception):
    """An error answer from the gateway: ``status``, ``code``, ``message`` and ``details``."""

    def __init__(self, status: int, code: str, message: str, details: Any = None, retry_after: float | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details, self.retry_after = (status, code, message, details,
                                                                                 retry_after)


class NotFoundError(ReachError):
    pass


class InvalidRequestError(ReachError):
    pass


class RateLimitedError(ReachError):
    pass


class ConflictError(ReachError):
    pass


_ERRORS = {400: InvalidRequestError, 404: NotFoundError, 409: ConflictError, 429: RateLimitedError}


class ReachClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 60.0, headers: dict | None = None):
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                  headers={"Authorization": f"Token {token}", **(headers or {})})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ReachClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _post(self, path: str, body: dict, headers: dict | None = None) -> dict:
        return self._handle(self._http.post(path, json={k: v for k, v in body.items() if v is not None},
                                            headers=headers))

    def _handle(self, response: httpx.Response) -> dict:
        try:
            data = response.json()
        except ValueError:
            data = {}
        if response.status_code >= 400 and "error" in data:
            err = data["error"]
            cls = _ERRORS.get(response.status_code, ReachError)
            retry = response.headers.get("Retry-After")
            raise cls(response.status_code, err.get("code", "error"), err.get("message", ""), err.get("details"),
                      float(retry) if retry else None)
        if response.status_code >= 400 and not data:
            raise ReachError(response.status_code, "http_error", response.text[:200])
        return data

    def invoke(self, *, task: str | None = None, capability: str | None = None, payload: dict | None = None,
               mode: str = "sync", request_id: str | None = None, callback_url: str | None = None,
               top_k: int | None = None, user_key: str | None = None, confirm: str | None = None,
               headers: dict | None = None) -> dict:
        """Returns the task (status, agent, result, decision...). A FAILED task is returned, not raised."""
        body = {"task": task, "capability": capability, "payload": payload or {}, "mode": mode,
                "request_id": request_id, "callback_url": callback_url, "top_k": top_k, "user_key": user_key,
                "confirm": confirm}
        return self._post("/api/v1/invoke", body, headers)

    def resolve(self, *, task: str | None = None, capability: str | None = None, payload: dict | None = None,
                action: str | None = None, domains: list[str] | None = None, top_k: int | None = None) -> dict:
        return self._post("/api/v1/resolve", {"task": task, "capability": capability, "payload": payload,
                                              "action": action, "domains": domains, "top_k": top_k})

    def task(self, request_id: str) -> dict:
        return self._handle(self._http.get(f"/api/v1/tasks/{request_id}"))
