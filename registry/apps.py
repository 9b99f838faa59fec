from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Registry"

    def ready(self) -> None:
        from reach_platform import openapi  # noqa: F401  (registers the agent-key security scheme)
