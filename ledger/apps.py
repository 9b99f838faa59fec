from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Cost ledger"

    def ready(self):
        from django.db.models.signals import post_delete, post_save

        from ledger import services
        from ledger.models import Budget

        def forget(**kwargs):
            services._budgets_cache.clear()

        post_save.connect(forget, sender=Budget, weak=False)
        post_delete.connect(forget, sender=Budget, weak=False)
