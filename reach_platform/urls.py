from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from reach_platform.metrics import metrics_view
from routing.api.views import A2APushView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/v1/", include("registry.api.urls")),
    path("api/v1/", include("routing.api.urls")),
    path("api/v1/", include("ledger.api.urls")),
    path("api/v1/", include("reviews.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    # A2A agents push task updates here (routing.a2a_transport.push_config)
    path("a2a-push/<int:task_pk>/<int:instance_pk>", A2APushView.as_view(), name="a2a-push"),
]
