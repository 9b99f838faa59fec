from django.urls import path
from rest_framework.routers import SimpleRouter

from registry.api import views

router = SimpleRouter()
router.register("agents", views.AgentViewSet, basename="agent")
router.register("instances", views.InstanceViewSet, basename="instance")
router.register("capability-versions", views.CapabilityVersionViewSet, basename="capability-version")

urlpatterns = [
    path("agents/register", views.RegisterView.as_view(), name="agent-register"),
    path("agents/heartbeat", views.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("agents/deregister", views.DeregisterView.as_view(), name="agent-deregister"),
    *router.urls,
]
