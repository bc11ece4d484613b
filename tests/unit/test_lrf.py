"""Spectral-LRF and Low-Space-LRF end to end on in-memory arrays (spec 3, 6.1, 7.2, 7.5).

T9/T10 linearity and chunking invariance, T12 output structure, T13 padded F4,
T14-T16 non-private utility, and the non-private acceptance check on 20000 x 2000.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from pipeline.algorithms import lrf
from pipeline.algorithms.base import ArraySource, Factorization, ReleaseHooks
from pipeline.algorithms.lrf import default_sketch_sizes, kernels, plan_lrf, run_lrf
from pipeline.linalg.metrics import hmt_bound, spectral_error
from pipeline.linalg.synthetic import low_rank_matrix, orthonormal_columns
from pipeline.mechanisms.clipping import scale_factors_from_sumsq
from pipeline.mechanisms.noise import NoiseKey
from pipeline.params import Algorithm, ClipSpec, LrfParams, PrivacyUnit
from pipeline.sketches.apply import PassRequest, block_partials
from pipeline.sketches.gaussian import GaussianOperator, OperatorCode

SPECTRAL, LOW_SPACE = Algorithm.SPECTRAL, Algorithm.LOW_SPACE
#: (algorithm, padded) combinations of spec 3.2/3.3 (padded applies to Low-Space only)
VARIANTS = [(SPECTRAL, False), (LOW_SPACE, False), (LOW_SPACE, True)]
VARIANT_IDS = ["spectral", "low-space", "low-space-padded"]
ORTHO_ATOL = 1e-10  # T12


def _seeds(global_seed: int, count: int) -> list[int]:
    """``count`` sketch seeds derived from ``global_seed`` (seed i of the spec's 0..count-1)."""
    return [
        int(np.random.SeedSequence([global_seed, i]).generate_state(1, np.uint64)[0])
        for i in range(count)
    ]


def _plan(
    shape: tuple[int, int],
    alg: Algorithm,
    padded: bool,
    k: int,
    t: int,
    v: int,
    *,
    private: bool = False,
    clip: ClipSpec | None = None,
    epsilon: float = 1.0,
) -> lrf.LrfPlan:
    extra: dict[str, Any] = {"epsilon": epsilon, "delta": 1e-6} if private else {}
    if clip is not None:
        extra["clip"] = clip
    return plan_lrf(
        LrfParams(
            algorithm=alg,
            rank=k,
            sketch_size=t,
            core_size=v,
            private=private,
            padded=padded,
            **extra,
        ),
        shape,
    )


def _check_structure(f: Factorization, m: int, n: int, k: int) -> None:
    assert f.U.shape == (m, k)
    assert f.S.shape == (k,)
    assert f.V.shape == (n, k)
    np.testing.assert_allclose(f.U.T @ f.U, np.eye(k), rtol=0, atol=ORTHO_ATOL)
    np.testing.assert_allclose(f.V.T @ f.V, np.eye(k), rtol=0, atol=ORTHO_ATOL)
    assert (f.S >= 0).all()
    assert (np.diff(f.S) <= 0).all()


def _err(A: np.ndarray, f: Factorization) -> float:
    return spectral_error(A, f.U, f.S, f.V)


# -------------------------------------------------------------- T12 output structure


@pytest.mark.parametrize("private", [False, True], ids=["nonprivate", "private"])
@pytest.mark.parametrize("shape", [(90, 60), (60, 90)], ids=["tall", "wide"])
@pytest.mark.parametrize(("alg", "padded"), VARIANTS, ids=VARIANT_IDS)
def test_output_structure(
    rng: np.random.Generator,
    alg: Algorithm,
    padded: bool,
    shape: tuple[int, int],
    private: bool,
) -> None:
    m, n = shape
    k = 4
    A = rng.standard_normal(shape)
    plan = _plan(
        shape,
        alg,
        padded,
        k,
        12,
        37,
        private=private,
        clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=5.0),
    )
    key = NoiseKey.insecure_from_seed(3) if private else None
    src = ArraySource(A)
    f = run_lrf(src, plan, ReleaseHooks(sketch_seed=11, noise_key=key))
    _check_structure(f, m, n, k)
    assert src.n_passes == 1  # one pass over A


@pytest.mark.parametrize("private", [False, True], ids=["nonprivate", "private"])
@pytest.mark.parametrize(("alg", "padded"), VARIANTS, ids=VARIANT_IDS)
def test_orientation_equals_running_on_transpose(
    rng: np.random.Generator, alg: Algorithm, padded: bool, private: bool
) -> None:
    """The transposed path equals running on A^T and swapping U and V (T12)."""
    A = rng.standard_normal((50, 80))
    k, t, v = 3, 10, 31
    out = []
    for X in (A, np.ascontiguousarray(A.T)):
        plan = _plan(
            X.shape,
            alg,
            padded,
            k,
            t,
            v,
            private=private,
            clip=ClipSpec(unit=PrivacyUnit.ENTRY, clip_norm=10.0),
        )
        key = NoiseKey.insecure_from_seed(4) if private else None
        out.append(run_lrf(
            ArraySource(X), plan, ReleaseHooks(sketch_seed=5, noise_key=key)
        ))
    f, g = out
    assert out[0].U.shape == (50, k)
    assert out[1].U.shape == (80, k)
    # same oriented matrix, operators and noise: equal up to BLAS summation order
    np.testing.assert_allclose(f.S, g.S, rtol=1e-12, atol=0)
    np.testing.assert_allclose(f.U, g.V, rtol=0, atol=1e-10)
    np.testing.assert_allclose(f.V, g.U, rtol=0, atol=1e-10)


# ----------------------------------------------------------------- T15 exact low rank


@pytest.mark.parametrize("shape", [(120, 80), (80, 120)], ids=["tall", "wide"])
@pytest.mark.parametrize(("alg", "padded"), VARIANTS, ids=VARIANT_IDS)
def test_exact_low_rank_is_recovered(
    rng: np.random.Generator, alg: Algorithm, padded: bool, shape: tuple[int, int]
) -> None:
    k = 5
    A = low_rank_matrix(*shape, np.array([50.0, 20.0, 9.0, 3.0, 1.0]), rng)
    f = run_lrf(
        ArraySource(A),
        _plan(shape, alg, padded, k, 15, 41),
        ReleaseHooks(sketch_seed=2, noise_key=None),
    )
    _check_structure(f, *shape, k)
    # T15: rank(A) = k is reproduced up to round-off, ||A - M_k|| <= 1e-8 ||A||
    assert _err(A, f) <= 1e-8 * 50.0
    np.testing.assert_allclose(f.S, [50.0, 20.0, 9.0, 3.0, 1.0], rtol=1e-8, atol=0)


# ------------------------------------------------------------------ T13 padded F4


def test_padded_f4_returns_first_columns_of_core_output(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T13: padded F4 gives exactly M_k[:, :n] of the padded (m x (m+n)) solution."""
    m, n, k = 40, 70, 3
    A = rng.standard_normal((m, n)) * 10
    plan = _plan(
        (m, n),
        LOW_SPACE,
        True,
        k,
        9,
        30,
        private=True,
        clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=100.0),
    )
    assert not plan.transpose  # padded mode keeps m <= n
    seen: dict[str, Any] = {}
    real_core, real_orth, real_basis = kernels.core_two_sided, kernels.orth, kernels._range_basis

    def core(*args: Any) -> Any:
        seen["core"] = real_core(*args)
        return seen["core"]

    def orth(Y: np.ndarray) -> np.ndarray:
        seen["V"] = real_orth(Y)
        return seen["V"]

    def range_basis(*args: Any) -> Any:
        Q, SQ, B = real_basis(*args)
        seen["U"] = Q if B is None else Q @ B  # the orthonormal range basis
        return Q, SQ, B

    monkeypatch.setattr(kernels, "core_two_sided", core)
    monkeypatch.setattr(kernels, "orth", orth)
    monkeypatch.setattr(kernels, "_range_basis", range_basis)
    f = run_lrf(
        ArraySource(A),
        plan,
        ReleaseHooks(sketch_seed=8, noise_key=NoiseKey.insecure_from_seed(8)),
    )
    WL, s, WR = seen["core"]
    assert seen["V"].shape == (n + m, 9)  # basis of the padded row sketch
    M_full = (seen["U"] @ WL * s) @ (seen["V"] @ WR).T  # m x (n + m)
    _check_structure(f, m, n, k)
    got = (f.U * f.S) @ f.V.T
    np.testing.assert_allclose(
        got, M_full[:, :n], rtol=0, atol=1e-10 * np.abs(M_full).max()
    )


# ------------------------------------------------------ T9 / T10 linearity, chunking


class ChunkedSource(ArraySource):
    """Reference source that sketches ``A`` chunk by chunk (spec 6.1) and maps row blocks.

    Row (column) clipping factors come from whole-row (column) sums of squares
    reduced over chunks first, as a distributed source must do (spec 1.3 rule 6).
    """

    def __init__(self, A: np.ndarray, row_chunk: int, col_chunk: int) -> None:
        super().__init__(A)
        m, n = A.shape
        self.rows = [(a, min(a + row_chunk, m)) for a in range(0, m, row_chunk)]
        self.cols = [(a, min(a + col_chunk, n)) for a in range(0, n, col_chunk)]

    def sketch(self, request: PassRequest) -> dict[str, Any]:
        self.n_passes += 1
        A = self._A
        m, n = A.shape
        M, N = (n, m) if request.transpose else (m, n)
        acc: dict[str, np.ndarray] = {}
        acc |= {name: np.zeros((M, op.dim)) for name, op in request.right}
        acc |= {name: np.zeros((op.dim, N)) for name, op in request.left}
        acc |= {name: np.zeros((s.dim, t.dim)) for name, s, t in request.two_sided}
        row_scale = col_scale = None
        if request.clip is not None and request.clip.unit is PrivacyUnit.ROW:
            row_scale = scale_factors_from_sumsq(
                sum((A[:, a:b] ** 2).sum(axis=1) for a, b in self.cols),
                request.clip.clip_norm,
            )
        if request.clip is not None and request.clip.unit is PrivacyUnit.COLUMN:
            col_scale = scale_factors_from_sumsq(
                sum((A[a:b] ** 2).sum(axis=0) for a, b in self.rows),
                request.clip.clip_norm,
            )
        for (i, (r0, r1)), (j, (c0, c1)) in itertools.product(
            enumerate(self.rows), enumerate(self.cols)
        ):
            parts = block_partials(
                A[r0:r1, c0:c1],
                r0,
                c0,
                request,
                row_scale=None if row_scale is None else row_scale[r0:r1],
                col_scale=None if col_scale is None else col_scale[c0:c1],
                where=f"chunk ({i}, {j})",
            )
            xr0, xr1, xc0, xc1 = (
                (c0, c1, r0, r1) if request.transpose else (r0, r1, c0, c1)
            )
            for name, part in zip(request.names, parts, strict=True):
                if any(name == nm for nm, _ in request.right):
                    acc[name][xr0:xr1] += part
                elif any(name == nm for nm, _ in request.left):
                    acc[name][:, xc0:xc1] += part
                else:
                    acc[name] += part
        return acc

    def _tall_blocks(self, length: int) -> list[tuple[int, int]]:
        step = max(1, self.rows[0][1] - self.rows[0][0])
        return [(a, min(a + step, length)) for a in range(0, length, step)]

    def tall_noise_gram(self, Y: np.ndarray, fn: Any, op: Any) -> Any:
        spans = self._tall_blocks(Y.shape[0])
        blocks = [fn(a, Y[a:b]) for a, b in spans]
        gram = sum(y.T @ y for y in blocks)
        left = None if op is None else sum(op.left(y, a, b) for y, (a, b) in zip(blocks, spans, strict=True))
        return np.vstack(blocks), gram, left

    def tall_left_sketch(self, Q: np.ndarray, op: GaussianOperator) -> np.ndarray:
        return sum(op.block(a, b).T @ Q[a:b] for a, b in self._tall_blocks(Q.shape[0]))  # type: ignore[return-value]


def _request(m: int, n: int, transpose: bool) -> PassRequest:
    M, N = (n, m) if transpose else (m, n)

    def op(code: int, length: int, dim: int) -> GaussianOperator:
        return GaussianOperator(
            root=77, code=code, length=length, dim=dim, tile_size=32
        )

    return PassRequest(
        transpose=transpose,
        clip=None,
        right=(("AP", op(OperatorCode.PHI, N, 7)),),
        left=(("SA", op(OperatorCode.S, M, 13)), ("PsiA", op(OperatorCode.PSI, M, 7))),
        two_sided=(("SAT", op(OperatorCode.S, M, 13), op(OperatorCode.T, N, 11)),),
    )


def _rel_close(actual: np.ndarray, desired: np.ndarray, rtol: float) -> None:
    # relative to the sketch's scale: entries can cancel to ~0, so atol = rtol * max
    np.testing.assert_allclose(
        actual, desired, rtol=rtol, atol=rtol * np.abs(desired).max()
    )


@pytest.mark.parametrize("transpose", [False, True])
def test_sketches_are_linear(rng: np.random.Generator, transpose: bool) -> None:
    """T9: noise-free f(A + B) = f(A) + f(B) for A Phi, S A, Psi A, S A T."""
    m, n = 70, 45
    A, B = rng.standard_normal((m, n)), rng.standard_normal((m, n)) * 3
    req = _request(m, n, transpose)
    fa, fb, fab = (ArraySource(X).sketch(req) for X in (A, B, A + B))
    for name in req.names:
        # T9 target rel. 1e-12: one extra rounding of the sum A + B per entry
        _rel_close(fab[name], fa[name] + fb[name], 1e-12)


@pytest.mark.parametrize("transpose", [False, True])
def test_sketches_do_not_depend_on_chunking(
    rng: np.random.Generator, transpose: bool
) -> None:
    """T10: chunkings (m, n), (64, 64), (100, 37) agree with each other and with numpy."""
    m, n = 150, 110
    A = rng.standard_normal((m, n))
    req = _request(m, n, transpose)
    X = A.T if transpose else A
    dense = {name: X @ op.dense() for name, op in req.right}
    dense |= {name: op.dense().T @ X for name, op in req.left}
    dense |= {name: s.dense().T @ X @ t.dense() for name, s, t in req.two_sided}
    for rc, cc in [(m, n), (64, 64), (100, 37), (1, 200)]:
        got = ChunkedSource(A, rc, cc).sketch(req)
        for name in req.names:
            # T10: 1e-10 relative (sums of <= 150 products regrouped)
            _rel_close(got[name], dense[name], 1e-10)


@pytest.mark.parametrize(
    "unit", [PrivacyUnit.ROW, PrivacyUnit.COLUMN, PrivacyUnit.ENTRY]
)
@pytest.mark.parametrize(("alg", "padded"), VARIANTS, ids=VARIANT_IDS)
def test_noisy_release_does_not_depend_on_chunking(
    rng: np.random.Generator, alg: Algorithm, padded: bool, unit: PrivacyUnit
) -> None:
    """T10 end to end: a fixed test noise key gives the same release for any chunking."""
    m, n, k = 130, 90, 3
    A = rng.standard_normal((m, n)) * rng.choice([0.1, 1.0, 5.0], size=(m, 1))
    plan = _plan(
        (m, n),
        alg,
        padded,
        k,
        10,
        35,
        private=True,
        clip=ClipSpec(unit=unit, clip_norm=4.0),
    )
    ref = run_lrf(
        ArraySource(A),
        plan,
        ReleaseHooks(sketch_seed=6, noise_key=NoiseKey.insecure_from_seed(6)),
    )
    for rc, cc in [(64, 64), (100, 37)]:
        got = run_lrf(
            ChunkedSource(A, rc, cc),
            plan,
            ReleaseHooks(sketch_seed=6, noise_key=NoiseKey.insecure_from_seed(6)),
        )
        # same statistics up to regrouped sums (T10, 1e-10); factors then agree to
        # the conditioning of the gaps in S, well within 1e-8 at these sizes
        np.testing.assert_allclose(got.S, ref.S, rtol=1e-10, atol=0)
        np.testing.assert_allclose(
            (got.U * got.S) @ got.V.T,
            (ref.U * ref.S) @ ref.V.T,
            rtol=0,
            atol=1e-9 * ref.S[0],
        )


# --------------------------------------------------------- T14 / T16 utility (non-private)


def _t14_spectrum(n_min: int, tail: str) -> np.ndarray:
    # sigma_1..5 = 100, then sigma_{5+j} = 0.9^(j-1) (decaying) or 1 (flat), j >= 1
    head = np.full(5, 100.0)
    rest = (
        0.9 ** np.arange(n_min - 5, dtype=np.float64)
        if tail == "decaying"
        else np.ones(n_min - 5)
    )
    return np.concatenate([head, rest])


#: The decaying T14 spectrum is generated up to rank 300: 0.9^294 ~ 4e-14 is below the
#: round-off of A's entries (~1e-16 * sigma_1 = 1e-14), so the matrix is the same in
#: float64 while generation and the error oracle get ~10x cheaper.
T14_RANK = 300


class _QRecorder(ArraySource):
    """Records the range basis ``U = orth(Y)`` the algorithm computes."""

    def tall_qr(self, Y: np.ndarray) -> np.ndarray:
        self.Q = super().tall_qr(Y)
        return self.Q


@pytest.mark.parametrize(
    ("alg", "shape", "bound"),
    [
        # Cor 18 with alpha = 0.1; spec 7.5 observed 20/20, max 1.06
        (SPECTRAL, (1500, 1000), 1.10),
        # Thm 9; spec 7.5 observed median 1.04, max 1.12
        (LOW_SPACE, (1000, 1500), 1.15),
    ],
    ids=["spectral", "low-space"],
)
def test_t14_decaying_spectrum(
    rng: np.random.Generator,
    global_seed: int,
    alg: Algorithm,
    shape: tuple[int, int],
    bound: float,
) -> None:
    """T14: ||A - M_k|| <= bound * Delta_k in >= 18 of 20 sketch seeds."""
    k, t, v = 5, 50, 101
    m, n = shape
    sv = _t14_spectrum(min(shape), "decaying")[:T14_RANK]
    Ua, Va = (
        orthonormal_columns(m, T14_RANK, rng),
        orthonormal_columns(n, T14_RANK, rng),
    )
    A = (Ua * sv) @ Va.T
    plan = _plan(shape, alg, False, k, t, v)
    ratios = []
    for s in _seeds(global_seed, 20):
        f = run_lrf(ArraySource(A), plan, ReleaseHooks(sketch_seed=s, noise_key=None))
        # exact error through the known factors of A (checked against
        # spectral_error in test_factored_error_matches_the_oracle)
        ratios.append(factored_spectral_error(Ua, sv, Va, f.U, f.S, f.V) / sv[k])
    passed = sum(r <= bound for r in ratios)
    assert passed >= 18, (
        f"{passed}/20 within {bound} Delta_k; ratios {np.round(ratios, 3).tolist()}"
    )


@pytest.mark.parametrize(
    ("alg", "shape"),
    [(SPECTRAL, (1500, 1000)), (LOW_SPACE, (1000, 1500))],
    ids=["spectral", "low-space"],
)
def test_t16_flat_tail_meets_hmt_but_not_the_paper(
    rng: np.random.Generator, global_seed: int, alg: Algorithm, shape: tuple[int, int]
) -> None:
    """T16: a flat tail satisfies the HMT-type bound, and NOT the paper's (1 + alpha) Delta_k.

    Documents the paper gap of spec 7.2: Cor 18 / Thm 9 claim ``(1 + alpha) Delta_k``
    but their proofs drop a ``||A - [A]_k||_F / sqrt(t)`` term, which dominates when
    the tail is flat (spec table: ratio ~8.9 at t = 50). The (1 + alpha) check is the
    negative control: it must fail here while the HMT check passes.
    """
    k, t, v = 5, 50, 101
    sv = _t14_spectrum(min(shape), "flat")
    A = low_rank_matrix(*shape, sv, rng)
    plan = _plan(shape, alg, False, k, t, v)
    hmt = hmt_bound(sv, k, t)  # [HMT11, Thm 10.6], a bound on the expectation
    for s in _seeds(global_seed, 2):
        src = _QRecorder(A)
        f = run_lrf(src, plan, ReleaseHooks(sketch_seed=s, noise_key=None))
        Q, X = src.Q, (A.T if plan.transpose else A)  # Q spans the oriented range
        range_err = spectral_error(
            X, Q, np.ones(Q.shape[1]), X.T @ Q
        )  # ||(I - Q Q^T) X||
        err = _err(A, f)
        # spec 7.2/T16: factor 2 over the HMT expectation for the range error and 3
        # for the final error (M_k lies in range(Q), so err >= range_err)
        assert range_err <= 2 * hmt
        assert err <= 3 * hmt
        assert err >= range_err * (1 - 1e-10)
        # negative control, the paper's claim with alpha = 0.1 fails on a flat tail
        assert err > 1.1 * sv[k], (
            f"flat tail unexpectedly met (1+alpha) Delta_k: {err / sv[k]:.3f}"
        )


# ------------------------------------------------ non-private acceptance, 20000 x 2000


def _complete_basis(
    Qa: np.ndarray, U: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[Qa, U] = [Qa, Q1] [[I, C], [0, R1]]`` with ``[Qa, Q1]`` orthonormal (CGS2)."""
    C = Qa.T @ U
    R = U - Qa @ C
    C2 = Qa.T @ R  # second Gram-Schmidt pass: restores orthogonality to ~eps
    R -= Qa @ C2
    Q1, R1 = np.linalg.qr(R)
    return Q1, C + C2, R1


def factored_spectral_error(
    Ua: np.ndarray,
    sa: np.ndarray,
    Va: np.ndarray,
    U: np.ndarray,
    S: np.ndarray,
    V: np.ndarray,
) -> float:
    """``||Ua diag(sa) Va^T - U diag(S) V^T||_2`` without forming either m x n matrix.

    Both terms live in ``span[Ua, U] x span[Va, V]``; with orthonormal bases of those
    spans the error is the spectral norm of an (r+k) x (r+k) core. O((m+n) r k).
    """
    _, Cl, Rl = _complete_basis(Ua, U)
    _, Cr, Rr = _complete_basis(Va, V)
    r, k = sa.size, S.size
    L = np.block([[np.eye(r), Cl], [np.zeros((k, r)), Rl]])
    R = np.block([[np.eye(r), Cr], [np.zeros((k, r)), Rr]])
    return float(np.linalg.norm((L * np.concatenate([sa, -S])) @ R.T, 2))


def test_factored_error_matches_the_oracle(rng: np.random.Generator) -> None:
    m, n, r, k = 300, 120, 40, 6
    sv = 0.8 ** np.arange(r)
    Ua, Va = orthonormal_columns(m, r, rng), orthonormal_columns(n, r, rng)
    A = (Ua * sv) @ Va.T
    f = run_lrf(
        ArraySource(A),
        _plan((m, n), SPECTRAL, False, k, 16, 65),
        ReleaseHooks(sketch_seed=1, noise_key=None),
    )
    # both are exact up to round-off; the core route loses at most ~eps * r
    np.testing.assert_allclose(
        factored_spectral_error(Ua, sv, Va, f.U, f.S, f.V),
        _err(A, f),
        rtol=1e-9,
        atol=1e-14,
    )


#: (t, v) measured to meet the acceptance criterion with a wide margin (simulation,
#: 20000 x 2000, k = 10, float64, error / sigma_11 over 30 seeds): at decay 0.8 max
#: 1.041 (vs 1.211 for the specification's (20, 81)); at decay 0.9 max 1.037, where
#: t = 20 fails (1.33) whatever v is. The defaults (30, 181) were measured at max
#: 1.068 (decay 0.8) and 1.087 (decay 0.9) over 12 seeds.
ACCEPTANCE_SIZES = (30, 321)


@pytest.mark.parametrize(
    "sizes",
    [
        pytest.param(None, id="defaults"),
        pytest.param(ACCEPTANCE_SIZES, id="larger"),
        # the specification's (20, 81) exceeds 1.1 in about half of the seeds (15 of
        # 30 with a Gaussian S, 3 of 6 with the sparse sign S), so it cannot be a
        # reliable control; t = k + 2 fails every time (1.68-3.21 over 6 seeds)
        pytest.param(
            (12, 49),
            id="too-small-t",
            marks=pytest.mark.xfail(
                reason="negative control: t = k + 2 leaves the range sketch short of "
                "the tail (error 1.68-3.21 sigma_11 over 6 simulated seeds)",
                strict=True,
            ),
        ),
    ],
)
def test_nonprivate_acceptance_20000x2000(
    global_seed: int, rng: np.random.Generator, sizes: Sequence[int] | None
) -> None:
    """Acceptance: ||A - U S V^T||_2 <= 1.1 sigma_{k+1}, k = 10, geometric decay 0.8.

    One seed in CI (the matrix is 320 MB in float64). The spectrum is truncated at
    rank 300, where 0.8^299 ~ 1e-29 is far below round-off of A's entries.
    """
    m, n, k, r = 20000, 2000, 10, 300
    t, v = sizes if sizes is not None else default_sketch_sizes(k, private=False)
    sv = 0.8 ** np.arange(r)
    Ua, Va = orthonormal_columns(m, r, rng), orthonormal_columns(n, r, rng)
    A = (Ua * sv) @ Va.T
    plan = _plan((m, n), SPECTRAL, False, k, t, v)
    f = run_lrf(
        ArraySource(A),
        plan,
        ReleaseHooks(sketch_seed=_seeds(global_seed, 1)[0], noise_key=None),
    )
    ratio = factored_spectral_error(Ua, sv, Va, f.U, f.S, f.V) / sv[k]
    assert ratio <= 1.1, f"(t, v) = {(t, v)}: error / sigma_(k+1) = {ratio:.4f}"
