"""kombu's Redis transport, with one client object per channel for its own commands.

kombu builds a new ``redis.Redis`` object around the channel's connection pool for every command it sends on its
own (``Channel.conn_or_acquire``): the unacked record of each delivered message, each ack, each restore sweep.
redis-py 8 fills a table of about 200 reply callbacks and an event dispatcher in every such object (91 us):
building them was 5 % of a Celery worker's CPU in bench/async_drain.py (py-spy ``--gil --threads``), a fifth of
its consumer thread's. The object only borrows connections from the pool, per command or pipeline, and is safe to
share between threads, so the channel keeps one (a new one when its pool is replaced, after a fork or a
reconnect). Everything else is kombu's transport unchanged.

Set as Celery's ``broker_transport`` (``CELERY_BROKER_TRANSPORT`` in settings); the broker URL stays ``redis://``.
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _shared_client = None

    def _create_client(self, asynchronous=False):
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:
            client = self._shared_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
