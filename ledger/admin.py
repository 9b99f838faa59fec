from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.safestring import mark_safe

from ledger.api.views import parse_week, report_csv
from ledger.charts import cost_bars_svg, trend_svg
from ledger.models import Budget, CostEntry
from ledger.selectors import previous_week, weekly_report, weekly_totals
from ledger.services import month_spend
from reach_platform.errors import ApplicationError
from registry.admin_audit import AuditedAdmin


@admin.register(CostEntry)
class CostEntryAdmin(admin.ModelAdmin):
    """Every attempt's cost. The weekly report (with chart and CSV) is at Ledger → Cost entries → Weekly report."""

    list_display = ["created_at", "request_id", "agent_endpoint", "team_slug", "attempt_number", "outcome",
                    "input_tokens", "output_tokens", "tokens_estimated", "cost"]
    list_filter = ["week", "team_slug", "outcome", "tokens_estimated"]
    search_fields = ["request_id", "agent_endpoint"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser or request.user.groups.filter(name="finance").exists() or \
            super().has_view_permission(request, obj)

    def get_urls(self):
        return [path("weekly/", self.admin_site.admin_view(self.weekly_view), name="ledger_weekly"),
                *super().get_urls()]

    def weekly_view(self, request):
        if not self.has_view_permission(request):
            return HttpResponse("The weekly report needs the finance role.", status=403)
        try:
            week = parse_week(request.GET.get("week"))
        except ApplicationError as exc:
            return HttpResponse(exc.message, status=400)
        team = request.GET.get("team") or None
        rows = weekly_report(week=week, team=team)
        if request.GET.get("export") == "csv":
            response = HttpResponse(report_csv(rows), content_type="text/csv")
            response["Content-Disposition"] = f'attachment; filename="reach-weekly-{week}.csv"'
            return response
        context = {**self.admin_site.each_context(request), "title": f"Weekly cost report {week}", "rows": rows,
                   "teams": weekly_report(week=week, team=team, by="team"), "week": week,
                   "previous": previous_week(week), "team": team or "",
                   "chart": mark_safe(cost_bars_svg(rows)),  # noqa: S308 (escaped SVG)
                   "trend": mark_safe(trend_svg(weekly_totals(week=week, team=team))),  # noqa: S308
                   "opts": self.model._meta}
        return TemplateResponse(request, "admin/ledger/weekly.html", context)


@admin.register(Budget)
class BudgetAdmin(AuditedAdmin):
    list_display = ["__str__", "team", "caller", "monthly_limit", "warn_ratio", "spent_this_month"]

    @admin.display(description="Spent this month")
    def spent_this_month(self, obj):
        spent = month_spend(obj)
        ratio = spent / float(obj.monthly_limit) if obj.monthly_limit else 0
        return f"{spent:.4f} ({ratio:.0%})"

    def changelist_view(self, request, extra_context=None):
        for budget in Budget.objects.select_related("team", "caller"):
            spent = month_spend(budget)
            if budget.monthly_limit and spent >= float(budget.monthly_limit) * budget.warn_ratio:
                self.message_user(request, f"{budget}: {spent:.4f} spent this month "
                                           f"({spent / float(budget.monthly_limit):.0%}).", messages.WARNING)
        return super().changelist_view(request, extra_context)
