"""What routing tells the apps that build on it (reviews listens; routing never imports reviews)."""

from django.dispatch import Signal

# sent after commit with version_ids: the capability versions that just had attempts recorded (canary watch)
attempts_recorded = Signal()
# sent when a task (re)enters the manual review queue, with task_id
review_item_opened = Signal()
