from django.urls import path

from reviews.api import views

urlpatterns = [
    path("capability-versions/<int:pk>/submit", views.SubmitView.as_view(), name="version-submit"),
    path("capability-versions/<int:pk>/approve", views.ApproveView.as_view(), name="version-approve"),
    path("capability-versions/<int:pk>/reject", views.RejectView.as_view(), name="version-reject"),
    path("tasks/<str:request_id>/feedback", views.FeedbackView.as_view(), name="task-feedback"),
    path("review-queue", views.QueueListView.as_view(), name="review-queue"),
    path("review-queue/<str:request_id>/claim", views.ClaimView.as_view(), name="review-claim"),
    path("review-queue/<str:request_id>/answer", views.AnswerView.as_view(), name="review-answer"),
    path("review-queue/<str:request_id>/reject", views.QueueRejectView.as_view(), name="review-reject"),
]
