"""Admin pages whose saves and deletes go through the audited object services (registry.audit)."""

from __future__ import annotations

from django.contrib import admin

from registry.audit import object_delete, object_save


class AuditedAdmin(admin.ModelAdmin):
    """Every save and delete from this admin page writes an audit row (who, before, after, request id)."""

    audit_exclude: tuple[str, ...] = ()  # fields never copied into audit rows (secrets)

    def _audit_fields(self, obj) -> list[str]:
        return [f.name for f in obj._meta.concrete_fields
                if f.name not in ("id", "created_at", "updated_at", *self.audit_exclude)]

    def save_model(self, request, obj, form, change):
        object_save(obj=obj, actor=request.user, fields=self._audit_fields(obj))

    def delete_model(self, request, obj):
        object_delete(obj=obj, actor=request.user, fields=self._audit_fields(obj))

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)
