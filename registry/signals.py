"""Signals other apps listen to (routing recalibrates its score scale when capability vectors change)."""

import django.dispatch

capability_vectors_changed = django.dispatch.Signal()
