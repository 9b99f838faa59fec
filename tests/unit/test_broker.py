"""The Celery broker transport (``reach_platform.broker``): kombu's Redis transport keeping one client object per
channel for its own commands, on the local Redis."""

from __future__ import annotations

import uuid

from kombu import Connection, Queue

from reach_platform.broker import Channel, Transport
from reach_platform.celery import app


def test_the_app_uses_the_transport():
    with app.connection_for_write() as connection:
        assert isinstance(connection.default_channel, Channel)


def test_the_pool_threads_share_one_result_backend():
    """Celery's tracer reads the task's backend on every task; a thread pool's threads share one (there is no
    result backend to hold state) instead of each building its own."""
    import threading

    seen = [app.backend]
    threads = [threading.Thread(target=lambda: seen.append(app.backend)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(backend) for backend in seen}) == 1


def test_a_channel_reuses_its_client_until_its_pool_is_replaced():
    with Connection(app.conf.broker_url, transport=Transport) as connection:
        channel = connection.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        assert first.connection_pool is channel.pool
        channel._pool = None  # as after a fork or a reconnect
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool


def test_messages_are_delivered_acked_and_restored_through_the_shared_client():
    """A message taken and not acked goes back to its queue when restored (what a killed worker's messages go
    through), and an acked one is gone: the unacked records are written and removed with the shared client."""
    name = f"reach-test-broker-{uuid.uuid4().hex}"
    with Connection(app.conf.broker_url, transport=Transport) as connection:
        channel = connection.channel()
        queue = Queue(name, channel=channel, auto_delete=True)
        queue.declare()
        try:
            producer = connection.Producer(channel)
            producer.publish({"n": 1}, routing_key=name, serializer="json")
            producer.publish({"n": 2}, routing_key=name, serializer="json")
            first = queue.get(no_ack=False)
            assert first is not None and first.payload == {"n": 1}
            first.ack()
            second = queue.get(no_ack=False)
            assert second is not None and second.payload == {"n": 2}
            assert queue.get(no_ack=False) is None
            channel.qos.restore_unacked()  # the second was never acked
            again = queue.get(no_ack=False)
            assert again is not None and again.payload == {"n": 2}
            again.ack()
            assert queue.get(no_ack=False) is None
        finally:
            queue.delete()
            channel.close()
