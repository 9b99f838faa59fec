from django.urls import path

from routing.api import views

urlpatterns = [
    path("resolve", views.ResolveView.as_view(), name="resolve"),
    path("invoke", views.InvokeView.as_view(), name="invoke"),
    path("tasks/<str:request_id>", views.TaskView.as_view(), name="task-detail"),
    path("tasks/<str:request_id>/callback", views.TaskCallbackView.as_view(), name="task-callback"),
]
