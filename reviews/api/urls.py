from django.urls import path

from reviews.api import views

urlpatterns = [
    path("capability-versions/<int:pk>/submit", views.SubmitView.as_view(), name="version-submit"),
    path("capability-versions/<int:pk>/approve", views.ApproveView.as_view(), name="version-approve"),
    path("capability-versions/<int:pk>/reject", views.RejectView.as_view(), name="version-reject"),
    path("capability-versions/<int:pk>/promote", views.PromoteCanaryView.as_view(), name="version-promote"),
    path("capability-versions/<int:pk>/rollback", views.RollbackCanaryView.as_view(), name="version-rollback"),
    path("capability-versions/<int:pk>/canary", views.CanaryStatsView.as_view(), name="version-canary"),
    path("tasks/<str:request_id>/feedback", views.FeedbackView.as_view(), name="task-feedback"),
    path("routing-feedback", views.FeedbackListView.as_view(), name="routing-feedback"),
    path("routing-feedback/promote", views.FeedbackPromoteView.as_view(), name="routing-feedback-promote"),
    path("review-queue", views.QueueListView.as_view(), name="review-queue"),
    path("review-queue/<str:key>/claim", views.ClaimView.as_view(), name="review-claim"),
    path("review-queue/<str:key>/answer", views.AnswerView.as_view(), name="review-answer"),
    path("review-queue/<str:key>/reject", views.QueueRejectView.as_view(), name="review-reject"),
    path("review-queue/<str:key>/redispatch", views.RedispatchView.as_view(), name="review-redispatch"),
    path("review-queue/<str:key>/replay", views.ReplayView.as_view(), name="review-replay"),
    path("review-queue/<str:key>/release", views.ReleaseView.as_view(), name="review-release"),
]
