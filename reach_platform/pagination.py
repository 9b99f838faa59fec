"""List pagination with bounds: ``?limit=`` is capped (DRF's ``max_limit``) and an ``?offset=`` past what the
database can count is a 400, not an integer overflow in SQL."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination

from reach_platform.errors import InvalidInput

MAX_LIMIT = 1000
MAX_OFFSET = 2**31 - 1


class Pagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_offset(self, request):
        raw = request.query_params.get(self.offset_query_param)
        if raw is not None and raw.isascii() and raw.isdigit() and int(raw) > MAX_OFFSET:
            raise InvalidInput(f"offset must be at most {MAX_OFFSET}.", code="invalid_offset")
        return super().get_offset(request)
