from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "routing"
    verbose_name = "Routing and execution"

    def ready(self):
        from routing import receivers  # noqa: F401
