"""Serving processes collect garbage less often (reach_platform.serving.tune_gc): the web process after its warm-up
and a Celery worker at start, from ``REACH_GC_THRESHOLD``; a malformed value stops the process with a clear error."""

import gc
import subprocess
import sys

import pytest
from celery.signals import worker_init

from reach_platform import asgi
from reach_platform.celery import _tune_gc


@pytest.fixture
def restore_gc():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_the_web_process_sets_the_thresholds_after_its_warm_up(settings, monkeypatch, restore_gc):
    settings.REACH = {**settings.REACH, "GC_THRESHOLD": (12345, 7, 9)}
    monkeypatch.setenv("REACH_WARM_UP", "0")
    gc.set_threshold(700, 10, 10)
    asgi._warm_up()
    assert gc.get_threshold() == (12345, 7, 9)


def test_a_worker_sets_them_when_it_starts(settings, restore_gc):
    settings.REACH = {**settings.REACH, "GC_THRESHOLD": (23456, 5, 6)}
    gc.set_threshold(700, 10, 10)
    assert any(receiver() is _tune_gc for _, receiver in worker_init.receivers)
    _tune_gc(sender=None)  # as the signal calls it (sending the signal would run Celery's Django fix-up too)
    assert gc.get_threshold() == (23456, 5, 6)


@pytest.mark.parametrize("value", ["20000,10", "0,10,10", "a,b,c", "-1,10,10"])
def test_a_malformed_threshold_is_refused_at_start(value):
    out = subprocess.run([sys.executable, "-c", "import django; django.setup()"], capture_output=True, text=True,
                         env={"DJANGO_SETTINGS_MODULE": "reach_platform.settings", "REACH_GC_THRESHOLD": value,
                              "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    assert "REACH_GC_THRESHOLD must be three positive integers" in out.stderr


def test_the_default_collects_less_often_than_cpython():
    out = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                          "print(settings.REACH['GC_THRESHOLD'])"], capture_output=True, text=True,
                         env={"DJANGO_SETTINGS_MODULE": "reach_platform.settings", "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "(20000, 10, 10)"
