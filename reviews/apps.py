from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"
    verbose_name = "Reviews and governance"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from reviews import receivers, roles

        post_migrate.connect(roles.ensure_roles, sender=self, dispatch_uid="reach-roles")
        receivers.connect()
