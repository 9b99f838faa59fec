from __future__ import annotations

import csv
import io
import re
from datetime import date, timedelta

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.permissions import BasePermission
from rest_framework.views import APIView

from ledger.selectors import weekly_report
from ledger.services import iso_week
from reach_platform.errors import InvalidInput
from reach_platform.pagination import Pagination
from registry.permissions import can_read_ledger

WEEK = re.compile(r"^\d{4}-W(0[1-9]|[1-4]\d|5[0-3])$")
COLUMNS = ["agent", "team", "week", "calls", "success_rate", "p50_latency_ms", "p95_latency_ms", "tokens_in",
           "tokens_out", "cost", "retries", "fallbacks", "calls_change", "cost_change"]


class CanReadLedger(BasePermission):
    """The finance role and admins (not the staff flag: every admin user is staff)."""

    message = "Reading the ledger needs the finance role."

    def has_permission(self, request, view):
        return bool(request.user and request.user.is_authenticated and can_read_ledger(request.user))


def report_csv(rows: list[dict], by: str = "agent") -> str:
    columns = COLUMNS if by == "agent" else COLUMNS[1:]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def parse_week(raw: str | None) -> str:
    from django.utils import timezone

    week = raw or iso_week(timezone.now())
    if not WEEK.match(week):
        raise InvalidInput(f"week must look like 2026-W48, not '{week}'.", code="invalid_week")
    try:  # 2025 has no week 53; there is no year 0 (and the report compares with the week before)
        date.fromisocalendar(int(week[:4]), int(week[6:]), 1) - timedelta(days=7)
    except (ValueError, OverflowError):
        raise InvalidInput(f"{week} is not a week of the ISO calendar.", code="invalid_week")
    return week


class WeeklyReportView(APIView):
    """GET /api/v1/ledger/weekly?week=YYYY-Www&team=&agent=&by=agent|team[&export=csv]"""

    permission_classes = [CanReadLedger]

    @extend_schema(parameters=[OpenApiParameter("week", str), OpenApiParameter("team", str),
                               OpenApiParameter("agent", str), OpenApiParameter("by", str),
                               OpenApiParameter("export", str)], responses={200: dict})
    def get(self, request):
        by = request.query_params.get("by", "agent")
        if by not in ("agent", "team"):
            raise InvalidInput("by must be 'agent' or 'team'.")
        rows = weekly_report(week=parse_week(request.query_params.get("week")),
                             team=request.query_params.get("team") or None,
                             agent=request.query_params.get("agent") or None, by=by)
        if request.query_params.get("export") == "csv":
            response = HttpResponse(report_csv(rows, by), content_type="text/csv")
            response["Content-Disposition"] = f'attachment; filename="reach-weekly-{rows[0]["week"] if rows else "empty"}.csv"'
            return response
        paginator = Pagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(page)
