from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("text, expected", [
    ("could you check whether order 5521 has shipped", "order.query"),
    ("帮我查一下订单 889 的物流到哪了", "order.query"),
    ("can you summarize the main points of this long article", "document.summarize"),
    ("把这篇文章总结成几个要点", "document.summarize"),
])
def test_chinese_and_english_requests_route_to_the_right_agent(api, running_agents, text, expected):
    running_agents(["order-agent", "doc-summary-agent", "notify-agent", "codegen-agent"])
    response = api.post("/api/v1/resolve", {"task": text}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["candidates"][0]["capability"] == expected, body
    assert body["decision"] in ("execute", "confirm")
    # the rule-only fast path computes no embedding, so it reports no semantic score
    computed = {"rule", "keyword_hits", "confidence", "health"} | (set() if body["fast_path"] else {"semantic"})
    assert set(body["candidates"][0]["breakdown"]) >= computed


def test_request_matching_a_negative_case_is_not_routed_there(api, running_agents):
    running_agents(["order-agent", "codegen-agent", "notify-agent"])
    # "send an email to the customer about the delay" is a negative case of order.query (and an example of notify)
    body = api.post("/api/v1/resolve", {"task": "send an email to the customer about the order delay"},
                    format="json").json()
    assert "order.query" not in [c["capability"] for c in body["candidates"]]
    assert any(f["capability"] == "order.query" and "negative" in f["reason"] for f in body["filtered"])


def test_unrelated_request_lands_in_manual_review(api, running_agents):
    running_agents(["order-agent", "doc-summary-agent", "notify-agent"])
    response = api.post("/api/v1/invoke", {"task": "what is the boiling point of mercury on mars"}, format="json")
    assert response.status_code == 202
    assert response.json()["status"] == "manual_review"


def test_resolve_is_a_dry_run(api, running_agents):
    from routing.models import Task

    running_agents(["order-agent"])
    api.post("/api/v1/resolve", {"task": "where is my order 1"}, format="json")
    assert Task.objects.count() == 0


def test_resolve_refuses_bad_input(api, registry_ready):
    assert api.post("/api/v1/resolve", {}, format="json").status_code == 400
    assert api.post("/api/v1/resolve", {"capability": "no.such"}, format="json").status_code == 404
    r = api.post("/api/v1/resolve", {"capability": "document.summarize", "payload": {"text": 5}}, format="json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_payload"


def _stored_best(version_ids: list[int], query, embedder: str) -> dict[int, tuple[float, float]]:
    """(best example, best negative case) cosine per version, from the stored vectors read back in numpy."""
    import numpy as np

    from registry.models import CapabilityVector
    from registry.vectors import embedding_bytes, vector_from_bytes

    best = {vid: [-1.0, -1.0] for vid in version_ids}
    q = query / np.linalg.norm(query)
    for vid, kind, raw in CapabilityVector.objects.filter(
            version_id__in=version_ids, embedder=embedder, kind__in=["example", "negative"]).values_list(
            "version_id", "kind", embedding_bytes()):
        v = vector_from_bytes(raw)
        slot = 0 if kind == "example" else 1
        best[vid][slot] = max(best[vid][slot], float(v @ q / np.linalg.norm(v)))
    return {vid: (a, b) for vid, (a, b) in best.items()}


@pytest.mark.parametrize("compute", ["auto", "off"])
def test_candidates_are_scored_in_process_as_postgresql_would_within_the_cache_budget(
        compute, registry_ready, settings, django_assert_num_queries):
    import numpy as np

    from registry.embedding import get_embedder, normalize_text
    from routing import resolver, snapshot

    settings.REACH = {**settings.REACH, "PGVECTOR_COMPUTE": compute}
    embedder = get_embedder()
    ids = [v.pk for v in registry_ready]
    query = resolver.embed_query(normalize_text("send a message to the on-call engineer that the database is down"))
    expected = _stored_best(ids, query, embedder.name)
    assert all(ex > -1.0 for ex, _ in expected.values()) and any(neg > -1.0 for _, neg in expected.values())

    # a registry within the budget is read whole with the routing snapshot: scoring its candidates reads nothing
    snapshot.current()
    with django_assert_num_queries(0):
        held = resolver.negative_and_example_similarity(ids, query, embedder.name)
    assert set(held) == set(ids)
    for vid in ids:
        assert np.allclose(held[vid], expected[vid], atol=1e-5), (vid, held[vid], expected[vid])

    # a budget that holds two versions: the snapshot reads two, and the others are scored by PostgreSQL (where it
    # computes similarity) or read on demand, dropping the least recently used, with the same numbers
    per_version = max(sum(m.nbytes for m in mats.values())
                      for mats in snapshot.TEXT_VECTORS.get(ids, embedder.name).values())
    settings.REACH = {**settings.REACH, "VECTOR_CACHE_MB": 2.5 * per_version / 2 ** 20}
    snapshot.clear_caches()
    snapshot.current()
    assert len(snapshot.TEXT_VECTORS.get(ids, embedder.name, fetch=False)) == 2
    with django_assert_num_queries(1):
        small = resolver.negative_and_example_similarity(ids, query, embedder.name)
    for vid in ids:
        assert np.allclose(small[vid], expected[vid], atol=1e-5), (vid, small[vid], expected[vid])
    cached = snapshot.TEXT_VECTORS.get(ids, embedder.name, fetch=False)
    assert len(cached) == 2  # never more than the budget holds
    assert sum(m.nbytes for mats in cached.values() for m in mats.values()) <= 2.5 * per_version


def test_a_version_re_embedded_by_a_new_revision_is_read_again_by_a_running_process(
        registry_ready, django_capture_on_commit_callbacks):
    """After an embedder upgrade, ``reach_reembed --missing`` rewrites the versions' vectors under the same embedder
    name; a process that already holds the old ones (centroids, examples, negative cases) reads the new ones with
    the next snapshot instead of comparing new queries with old vectors until it restarts."""
    import numpy as np

    from registry.embedding import get_embedder, normalize_text
    from registry.embedding_service import capability_versions_embed
    from registry.models import CapabilityVector
    from registry.signals import capability_vectors_changed
    from registry.vectors import embedding_bytes, vector_from_bytes
    from routing import resolver, snapshot

    embedder = get_embedder()
    ids = [v.pk for v in registry_ready]
    before = snapshot.current()  # the process holds every version's vectors
    assert len(snapshot.TEXT_VECTORS.get(ids, embedder.name, fetch=False)) == len(ids)

    class NextRevision:
        """The same embedder, one revision on, whose numbers differ (a permutation of each vector's entries)."""

        name, dim, revision = embedder.name, embedder.dim, int(getattr(embedder, "revision", 1)) + 1

        def encode(self, texts):
            return embedder.encode(texts)[:, ::-1].copy()

    changed = registry_ready.first()
    with django_capture_on_commit_callbacks(execute=True):  # the new snapshot generation is set on commit
        capability_versions_embed(versions=[changed], embedder=NextRevision())
        capability_vectors_changed.send(sender=type(changed), version_ids=[changed.pk])

    after = snapshot.current()
    assert after is not before
    stored = np.stack([vector_from_bytes(raw) for raw in CapabilityVector.objects.filter(
        version_id=changed.pk, embedder=embedder.name, kind="centroid").values_list(embedding_bytes(), flat=True)])
    row = int(np.flatnonzero(after.centroid_ids == changed.pk)[0])
    assert np.allclose(after.centroids[row], stored[0])
    query = resolver.embed_query(normalize_text("please summarize this quarterly report for me"))
    expected = _stored_best(ids, query, embedder.name)
    scored = resolver.negative_and_example_similarity(ids, query, embedder.name)
    for vid in ids:
        assert np.allclose(scored[vid], expected[vid], atol=1e-5), (vid, scored[vid], expected[vid])
    # the versions that were not re-embedded are still held, the re-embedded one is held anew
    assert len(snapshot.TEXT_VECTORS.get(ids, embedder.name, fetch=False)) == len(ids)


def test_interchangeable_agents_share_the_traffic_and_the_less_loaded_one_goes_first(running_agents, tmp_path):
    """Two agents offering one service (the same examples: one family) are told apart by load, not by which one's
    examples score a hair higher: with equal load both come first in turn; with one of them busy, the other one
    does. Each is scored with the family's best semantic component, so the decision does not depend on the pick."""
    import yaml
    from django.core.management import call_command
    from django.utils import timezone

    from registry.embedding import get_embedder
    from registry.embedding_service import capability_version_embed
    from registry.models import Agent, CapabilityVersion, Instance
    from routing import capacity, resolver, snapshot
    from routing.calibration_service import calibration_refresh
    from tests.routing.conftest import instance_of

    running_agents(["order-agent", "doc-summary-agent", "notify-agent", "codegen-agent"])
    twin = yaml.safe_load(open("examples/descriptors/order-agent.yaml"))
    twin["agent"]["endpoint_id"] = "order-agent-b"
    twin["capabilities"][0]["name"] = "order.query-b"
    (tmp_path / "order-agent-b.yaml").write_text(yaml.safe_dump(twin, allow_unicode=True))
    call_command("reach_import", str(tmp_path / "order-agent-b.yaml"), verbosity=0)
    version = CapabilityVersion.objects.get(capability__name="order.query-b")
    version.state = "active"
    version.save(update_fields=["state"])
    capability_version_embed(version=version, embedder=get_embedder())
    calibration_refresh()
    now = timezone.now()
    b = Instance.objects.create(agent=Agent.objects.get(endpoint_id="order-agent-b"), instance_id="b-1",
                                url="http://127.0.0.1:9/invoke", max_concurrency=8, last_heartbeat_at=now,
                                last_seen_at=now)
    a = instance_of("order-agent")
    snapshot.bump_generation()
    snapshot.clear_caches()

    def first_of(n: int) -> list[str]:
        out = []
        for _ in range(n):
            res = resolver.resolve(task="where is my order 5521, has it shipped")
            out.append(res.candidates[0].version.capability)
            assert {c.version.capability for c in res.candidates[:2]} == {"order.query", "order.query-b"}
            assert res.candidates[0].score == res.candidates[1].score  # the family's semantic component for both
            reasons = res.candidates[0].reasons + res.candidates[1].reasons
            assert any("interchangeable with order.query" in r for r in reasons)
        return out

    assert set(first_of(30)) == {"order.query", "order.query-b"}  # equal load: either, at random
    for _ in range(3):  # three calls in flight on order-agent's instance
        capacity.acquire(f"instance:{a.pk}", cap=8)
    assert set(first_of(10)) == {"order.query-b"}
    for _ in range(5):  # now the twin is the busier one
        capacity.acquire(f"instance:{b.pk}", cap=8)
    assert set(first_of(10)) == {"order.query"}


def test_candidates_of_equal_score_keep_the_ranking_order(running_agents):
    """Below the manual-review floor every candidate's semantic component is 0, so their scores are equal: they
    stay in the ranking's order (the head's, whose softmax share the breakdown shows), the same on every resolve,
    instead of going to the least loaded or to chance as interchangeable agents do (on CLINC150 that chance cost
    2.2 points of top-1: 0.926 -> 0.904)."""
    from routing import resolver

    running_agents(["order-agent", "doc-summary-agent", "notify-agent", "codegen-agent"])
    orders = set()
    for _ in range(15):
        res = resolver.resolve(task="what is the boiling point of mercury on mars")
        assert res.decision == "manual_review"
        scores = [c.score for c in res.candidates]
        assert len(res.candidates) >= 3 and len(set(scores)) == 1, scores  # the equal-score case itself
        shares = [c.breakdown["head_share"] for c in res.candidates]
        assert shares == sorted(shares, reverse=True), shares
        orders.add(tuple(c.version.capability for c in res.candidates))
    assert len(orders) == 1, orders


def test_a_big_registrys_centroids_are_scored_in_two_halves_with_the_same_cosines(monkeypatch):
    """numpy's BLAS runs on one thread, so from SPLIT_CENTROIDS_AT numbers on the query's product with the
    centroids runs as two halves on two threads: the same cosines, row for row, as the whole product."""
    import threading

    import numpy as np

    from registry.embedding import blas_threads
    from routing import resolver

    rng = np.random.default_rng(7)
    centroids = rng.standard_normal((2_001, 896)).astype(np.float32)
    query = rng.standard_normal(896).astype(np.float32)
    threads = set()
    dot = np.dot

    def seen(*args):
        threads.add(threading.current_thread().name)
        return dot(*args)

    monkeypatch.setattr(resolver.np, "dot", seen)
    with blas_threads(1):  # as in a process that embeds (registry.embedding.one_blas_thread)
        whole = centroids @ query
        assert centroids.size < resolver.SPLIT_CENTROIDS_AT
        assert np.array_equal(resolver.centroid_cosines(centroids, query), whole) and not threads
        monkeypatch.setattr(resolver, "SPLIT_CENTROIDS_AT", 1_000_000)
        assert np.array_equal(resolver.centroid_cosines(centroids, query), whole)
    assert len(threads) == 1 and threads.pop().startswith("resolve-half")
