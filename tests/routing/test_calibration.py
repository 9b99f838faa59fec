"""The calibration holds its stated risks on a registry it never saw, and recalibrates when versions change.

The registry is synthetic and seeded: capabilities are directions on the unit sphere in groups of related ones
(a "domain" shares a direction), requests are noisy draws around their capability. Unregistered neighbours -- the
hard out-of-scope case -- are a whole domain and single capabilities of other domains that are not registered."""

from __future__ import annotations

import numpy as np
import pytest

from routing import calibration as cal

DIM = 64


def _world(seed: int, domains: int = 12, per_domain: int = 6, noise: float = 0.4):
    """``domains`` x ``per_domain`` capabilities: capability 6d..6d+5 belong to domain d."""
    rng = np.random.default_rng(seed)
    centres = []
    for _ in range(domains):
        d = rng.normal(size=DIM)
        for _ in range(per_domain):
            centres.append(d + 0.9 * rng.normal(size=DIM))
    centres = cal._unit(np.array(centres))

    def draw(c: int, n: int) -> np.ndarray:
        return cal._unit(centres[c] + noise * rng.normal(size=(n, DIM)) / np.sqrt(DIM) * 4).astype(np.float32)

    return centres, draw


def _measure(seed: int, head: bool, max_wrong: float, max_oos: float, siblings_only: bool = False,
             coverage: str = "mix"):
    centres, draw = _world(seed)
    k = len(centres)
    rng = np.random.default_rng(seed + 1)
    # the two kinds of unregistered neighbour the calibration simulates, in equal measure: a whole domain nobody
    # registered, and single capabilities whose siblings are registered (``siblings_only``: 12 of the second kind)
    domain = int(rng.integers(k // 6))
    whole = set() if siblings_only else set(range(domain * 6, domain * 6 + 6))
    unregistered = whole | set(rng.choice(sorted(set(range(k)) - whole), size=12 - len(whole), replace=False).tolist())
    registered = [c for c in range(k) if c not in unregistered]
    examples = [draw(c, 10) for c in registered]
    negatives = [np.zeros((0, DIM), np.float32) for _ in registered]
    calibration = cal.fit_calibration(examples, negatives, head=head, max_wrong=max_wrong, max_oos=max_oos,
                                      oos_coverage=coverage)
    X = np.vstack(examples)
    y = np.concatenate([[i] * len(e) for i, e in enumerate(examples)])
    ranker = cal._Ranker(X, y, head, negatives, 0.0)

    def executed(Q):
        F, top, _ = ranker.features(Q, np.zeros((len(Q), len(registered))))
        return calibration.band_score(F[:, 0], F[:, 1], F[:, 2], keywords=F[:, 3], share=F[:, 4]) \
            >= calibration.execute_at, top

    inscope = np.vstack([draw(c, 40) for c in registered])
    truth = np.concatenate([[i] * 40 for i in range(len(registered))])
    done, top = executed(inscope)
    out, _ = executed(np.vstack([draw(c, 40) for c in sorted(unregistered)]))
    return {"right": float((done & (top == truth)).mean()), "wrong": float((done & (top != truth)).mean()),
            "oos": float(out.mean()), "cuts": calibration.cuts}


@pytest.mark.parametrize("head", [False, True])
def test_stated_risks_hold_on_unseen_synthetic_registries(head):
    runs = [_measure(seed, head, 0.02, 0.05) for seed in range(3)]
    # the promise is on the expected share: the mean over registries is within it up to sampling error (each
    # registry is measured on 2,400 in-scope and 480 out-of-scope draws: one standard error is about 0.003 and
    # 0.01), and no single one far off
    assert np.mean([r["wrong"] for r in runs]) <= 0.02 + 0.003, runs
    assert np.mean([r["oos"] for r in runs]) <= 0.05 + 0.01, runs
    assert max(r["wrong"] for r in runs) <= 0.04 and max(r["oos"] for r in runs) <= 0.10, runs
    assert np.mean([r["right"] for r in runs]) >= 0.2, runs  # and the bands still execute


def test_a_stricter_stated_risk_executes_less():
    loose, strict = _measure(7, False, 0.05, 0.20), _measure(7, False, 0.005, 0.01)
    assert strict["cuts"]["latin"][1] > loose["cuts"]["latin"][1]
    assert strict["wrong"] <= loose["wrong"] and strict["oos"] <= loose["oos"] and strict["right"] < loose["right"]


def test_each_kind_coverage_holds_the_out_of_scope_level_on_the_strictest_kind():
    rng = np.random.default_rng(3)
    # given simulated cases: right in-scope ones, easy out-of-scope ones (a cluster left out) and hard ones
    # (single capabilities left out) that score like right requests
    p = np.concatenate([rng.uniform(0.5, 1.0, 400), rng.uniform(0.0, 0.3, 200), rng.uniform(0.3, 1.0, 200)])
    right = np.arange(800) < 400
    oos = ~right
    kinds = np.concatenate([np.zeros(400, int), np.ones(200, int), np.full(200, 2)])
    mixed = cal._cuts(p, right, oos, 0.02, 0.05)[1]
    each = cal._cuts(p, right, oos, 0.02, 0.05, kinds)[1]
    hard = cal.risk_cut(p[kinds == 2], np.ones(200, bool), 200, 0.05)
    # when the level is held on each kind apart, then the EXECUTE cut-off is the hard kind's own
    assert each == hard > mixed
    # and the hard kind executes within the level there, where the pooled cut-off let it through more often
    assert (p[kinds == 2] >= each).mean() <= 0.05 < (p[kinds == 2] >= mixed).mean()
    # and with no out-of-scope case to certify the level, nothing executes either way
    assert cal._cuts(p[right], right[right], oos[right], 0.02, 0.05, kinds[right])[1] == float("inf")
    assert cal._cuts(p[right], right[right], oos[right], 0.02, 0.05)[1] == float("inf")


def test_each_kind_coverage_on_registries_whose_unregistered_capabilities_are_all_siblings():
    runs = {coverage: [_measure(seed, True, 0.02, 0.05, siblings_only=True, coverage=coverage) for seed in range(3)]
            for coverage in ("mix", "each")}
    # when single capabilities are unregistered while their siblings stay, then "each" holds the stated level up
    # to sampling error (480 out-of-scope draws a registry: one standard error about 0.01)
    assert np.mean([r["oos"] for r in runs["each"]]) <= 0.05 + 0.01, runs
    # and, registry by registry, never executes them more often than "mix", at a cut-off at least as strict
    for mix, each in zip(runs["mix"], runs["each"], strict=True):
        assert each["oos"] <= mix["oos"] and each["cuts"]["latin"][1] >= mix["cuts"]["latin"][1]
    # and, where the hard kind's cut-off is the binding one, strictly fewer of them execute
    assert any(e["oos"] < m["oos"] and e["cuts"]["latin"][1] > m["cuts"]["latin"][1]
               for m, e in zip(runs["mix"], runs["each"], strict=True)), runs
    # and an unknown coverage is refused by name, like the setting that carries it
    with pytest.raises(ValueError, match="mix, each"):
        cal.fit_calibration(*_registry_of(3), oos_coverage="all")


@pytest.mark.parametrize("value, coverage", [("each", "each"), ("", "mix"), ("strict", None)])
def test_the_coverage_setting_is_checked_when_the_settings_load(value, coverage):
    import os
    import subprocess
    import sys

    # given the setting in a fresh process's environment, when the settings load, then a known value is taken
    # (empty: the default) and any other stops them with a message naming the choices
    env = {**os.environ, "REACH_EXECUTE_OOS_COVERAGE": value}
    done = subprocess.run([sys.executable, "-c", "from reach_platform import settings; "
                           "print(settings.REACH['EXECUTE_OOS_COVERAGE'])"],
                          env=env, capture_output=True, text=True, timeout=60)
    if coverage is None:
        assert done.returncode != 0
        assert "REACH_EXECUTE_OOS_COVERAGE must be one of mix, each, not 'strict'" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == coverage


def _registry_of(k: int):
    _, draw = _world(0, domains=1, per_domain=k)
    return [draw(c, 5) for c in range(k)], [np.zeros((0, DIM), np.float32) for _ in range(k)]


def test_risk_cut_is_the_conformal_bound():
    p = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    bad = np.array([False, False, True, False, True])
    # n = 9 cases in all: executing p >= 0.6 has 1 bad -> (1 + 1) / 10 = 0.2; p >= 0.5 has 2 -> 0.3
    assert cal.risk_cut(p, bad, 9, 0.2) == 0.6
    assert cal.risk_cut(p, bad, 9, 0.1) == 0.8  # (0 + 1) / 10; p >= 0.7 would be (1 + 1) / 10
    assert cal.risk_cut(p, bad, 9, 0.05) == float("inf")  # too few cases to promise 5 %


def test_stored_form_round_trips_an_execute_cut_that_cannot_be_met():
    c = cal.default_calibration()
    again = cal.Calibration.from_json(c.to_json())
    assert again.cuts["latin"][1] == float("inf")
    assert float(again.band_score(0.99, 1.0, 0.99)) < 0.75  # never EXECUTE


def test_a_calibration_stored_before_the_head_share_reads_as_the_same_model():
    # given a calibration stored by the release before, with four feature weights and an intercept
    stored = {"coef": [7.0, 0.8, 3.0, 1.0, -8.0], "cuts": {"latin": [0.3, 0.6], "other": [0.3, 0.6]}, "mode": "head"}
    # when it is read, then it gives the head share no weight and every other feature the weight it had
    c = cal.Calibration.from_json(stored)
    assert c.coef == (7.0, 0.8, 3.0, 1.0, 0.0, -8.0)
    z = 7.0 * 0.8 + 0.8 * 0.3 + 3.0 * 0.85 + 1.0 * 0.5 - 8.0
    assert float(c.probability(0.8, 0.3, 0.85, 0.5, share=0.9)) == pytest.approx(1 / (1 + np.exp(-z)))


def test_the_head_share_is_the_top_capabilitys_softmax_among_the_fetched_candidates():
    # given 30 capabilities, the top one by the head, and three more with logits close behind it: two among the
    # nearest centroids (as the resolver fetches them) and one far from the request by cosine
    cos = np.linspace(0.9, 0.0, 30)[None, :]
    logits = np.full((1, 30), -20.0)
    logits[0, [0, 1, 2, 29]] = [5.0, 4.0, 4.0, 4.9]
    fam = np.eye(30, dtype=bool)
    # when the features are computed with the head among the 3 nearest centroids, then the share is the top
    # capability's softmax over those three: the far one does not count, as the resolver never fetches it
    F, top = cal.top_features(logits, cos, fam, head=True, candidates=3)
    assert top[0] == 0
    assert F[0, 4] == pytest.approx(np.exp(5) / (np.exp(5) + 2 * np.exp(4)))
    # and without a head (the ranking is the cosines) there is no share
    F, _ = cal.top_features(cos, cos, fam)
    assert F[0, 4] == 0.0


def test_the_probability_never_falls_as_a_feature_rises():
    # given cases where a feature duplicates another with noise (as the centroid and closest-example cosines do),
    # an unconstrained fit can give one of them a negative weight
    rng = np.random.default_rng(3)
    cos = rng.uniform(0.2, 0.8, 400)
    best = cos + rng.normal(0, 0.02, 400)
    right = rng.uniform(size=400) < 1 / (1 + np.exp(-(12 * cos - 6)))
    X = np.stack([cos, rng.uniform(0, 2, 400), best, np.zeros(400)], 1)
    # when the calibration fits its probability, then every feature weight is >= 0
    w = cal._fit_monotone_logistic(X, right.astype(float))
    assert (w[:4] >= 0).all() and w[0] + w[2] > 5
    # and a weight the unconstrained fit made negative is the one set to zero
    plain = cal._fit_logistic(X, right.astype(float))
    assert all(w[i] == 0 for i in range(4) if plain[i] < 0 and i != 3)


def test_a_negative_case_routed_to_its_own_capability_weighs_on_the_cut_off():
    # given a registry where capability 0 lists two negative cases, one of them right among its examples
    centres, draw = _world(5, domains=3, per_domain=3)
    examples = [draw(c, 10) for c in range(9)]
    inside = draw(0, 1)
    negatives = [np.vstack([inside, draw(8, 1)])] + [np.zeros((0, DIM), np.float32) for _ in range(8)]
    # when the cases are simulated, then that negative case is a wrong in-scope case the filter does not hide
    # (compared with itself it would always be filtered out and never count)
    F, right, oos, _, filtered, _ = cal.simulated_cases(examples, negatives, head=False)
    wrong_unfiltered = ~right & ~oos & ~filtered
    assert wrong_unfiltered.sum() >= 1
    assert np.isclose(F[wrong_unfiltered, 2], float((examples[0] @ inside[0]).max())).any()


@pytest.mark.django_db
def test_changes_in_a_row_queue_one_recalibration_until_it_starts(registry_ready):
    from reach_platform.celery import app
    from routing import snapshot
    from routing.tasks import RECALIBRATE_PENDING_KEY, recalibrate, recalibrate_soon

    snapshot.redis_client().delete(RECALIBRATE_PENDING_KEY)
    try:
        # given an import's embedding tasks each signalling changed vectors, then one recalibration is queued
        assert recalibrate_soon() is True
        assert [recalibrate_soon() for _ in range(19)] == [False] * 19
        # when it starts (run here as a worker would), then it reads the registry and the next change queues anew
        assert recalibrate()["capabilities"] == 6
        assert recalibrate_soon() is True
    finally:
        snapshot.redis_client().delete(RECALIBRATE_PENDING_KEY)
        app.control.purge()  # the queued messages: no worker of another test should fit this test's registry
