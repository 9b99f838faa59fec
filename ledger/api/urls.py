from django.urls import path

from ledger.api import views

urlpatterns = [path("ledger/weekly", views.WeeklyReportView.as_view(), name="ledger-weekly")]
