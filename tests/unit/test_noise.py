"""Secret noise keys and tiled Gaussian noise (spec 4.6 item 3, 5.4; T6)."""

from __future__ import annotations

import hashlib
import itertools
import pickle
import subprocess
import sys

import numpy as np
import pytest
from randomgen import ChaCha

import pipeline.mechanisms.noise as noise_module
from pipeline.algorithms.base import ArraySource, ReleaseHooks
from pipeline.algorithms.lrf import plan_lrf, run_lrf
from pipeline.errors import InvalidParameterError
from pipeline.mechanisms.noise import GaussianNoise, NoiseCode, NoiseKey
from pipeline.params import Algorithm, ClipSpec, LrfParams, PrivacyUnit


def _spellings(secret: bytes) -> list[str]:
    """Every way the key could leak into text."""
    return [
        secret.hex(),
        secret.hex().upper(),
        secret.hex()[:16],  # even a prefix is too much
        repr(secret),
        str(secret),
        secret.decode("latin-1"),
        str(int.from_bytes(secret, "little")),
        str(int.from_bytes(secret, "big")),
    ]


@pytest.mark.parametrize(
    "make",
    [
        NoiseKey.fresh,
        lambda: NoiseKey.insecure_from_seed(7),
        lambda: NoiseKey.fresh().derive(101),
    ],
)
def test_key_text_never_contains_the_secret(make) -> None:  # type: ignore[no-untyped-def]
    key = make()
    noise = GaussianNoise(key=key, sigma=1.0, length=4, dim=2)
    texts = [
        repr(key),
        str(key),
        f"{key}",
        f"{key!r}",
        repr([key]),
        repr({"k": key}),
        repr(noise),
        str(noise),
    ]
    for text in texts:
        for leak in _spellings(key.secret):
            assert leak not in text
    assert "redacted" in repr(key)
    # the fingerprint is a one-way tag, not a piece of the key
    assert key.fingerprint() not in key.secret.hex()
    assert len(key.fingerprint()) == 16


def test_fresh_keys_differ_and_are_secure() -> None:
    keys = [NoiseKey.fresh() for _ in range(8)]
    assert len({k.secret for k in keys}) == 8
    assert not any(k.insecure for k in keys)
    assert all(len(k.secret) == 32 for k in keys)


def test_insecure_from_seed_is_reproducible_and_flagged() -> None:
    a, b, c = (
        NoiseKey.insecure_from_seed(3),
        NoiseKey.insecure_from_seed(3),
        NoiseKey.insecure_from_seed(4),
    )
    assert a.secret == b.secret
    assert a.secret != c.secret
    assert a.insecure
    assert c.insecure
    # the flag survives derivation, so everything built from it is marked not private
    assert a.derive(101).insecure
    assert not NoiseKey.fresh().derive(101).insecure
    assert "insecure=True" in repr(a)


def test_key_length_is_enforced() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        NoiseKey(b"short")


def test_derive_separates_labels() -> None:
    root = NoiseKey.insecure_from_seed(11)
    labels: list[tuple[int | str, ...]] = [
        (101,),
        (102,),
        (103,),
        ("Y",),
        ("Z",),
        (101, 0),
        (101, 1),
        (0, 101),
        ("release-a", 101),
    ]
    derived = [root.derive(*lbl).secret for lbl in labels]
    assert len(set(derived)) == len(labels)
    assert root.derive(101).secret == root.derive(101).secret  # deterministic
    assert root.secret not in derived
    # a different root gives different sub-keys for the same label
    assert NoiseKey.insecure_from_seed(12).derive(101).secret != root.derive(101).secret


def test_noise_key_pickles_for_workers() -> None:
    key = NoiseKey.insecure_from_seed(5).derive(int(NoiseCode.Y))
    again = pickle.loads(pickle.dumps(key))
    assert again == key


# ------------------------------------------------------------------ GaussianNoise


def _noise(
    sigma: float = 2.5, length: int = 45, dim: int = 3, tile: int = 8, seed: int = 1
) -> GaussianNoise:
    return GaussianNoise(
        key=NoiseKey.insecure_from_seed(seed).derive(int(NoiseCode.Z)),
        sigma=sigma,
        length=length,
        dim=dim,
        tile_size=tile,
    )


@pytest.mark.parametrize(
    "cuts", [(0, 45), (0, 8, 16, 24, 32, 40, 45), (0, 1, 9, 9, 44, 45), (0, 7, 17, 45)]
)
def test_block_over_any_split_equals_dense(cuts: tuple[int, ...]) -> None:
    noise = _noise()
    dense = noise.dense()
    assert dense.shape == (45, 3)
    parts = [noise.block(a, b) for a, b in itertools.pairwise(cuts)]
    np.testing.assert_array_equal(np.vstack(parts), dense)
    # add_to_block adds exactly the matching slice
    blk = np.arange(21.0).reshape(7, 3)
    np.testing.assert_array_equal(noise.add_to_block(10, blk), blk + dense[10:17])


@pytest.mark.parametrize(("start", "stop"), [(0, 45), (3, 45), (5, 37)])
def test_threaded_draws_give_the_one_threads_bits(
    monkeypatch: pytest.MonkeyPatch, start: int, stop: int
) -> None:
    """Tiles drawn on several threads (THREADED_DRAWS) land in their own rows:
    the same bits as one thread, whole blocks and blocks cut inside tiles."""
    one = _noise().block(start, stop)
    monkeypatch.setattr(noise_module, "THREADED_DRAWS", 1)
    monkeypatch.setattr(noise_module.os, "cpu_count", lambda: 4)
    threaded = _noise().block(start, stop)
    assert threaded.tobytes() == one.tobytes()
    # negative control: another key's threaded draw differs
    assert _noise(seed=99).block(start, stop).tobytes() != one.tobytes()


def test_noise_scale_and_bounds() -> None:
    a, b = _noise(sigma=1.0), _noise(sigma=3.0)
    np.testing.assert_allclose(b.dense(), 3.0 * a.dense(), rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match="outside"):
        a.block(0, 46)
    # tile() is the unscaled standard normal draw
    np.testing.assert_array_equal(b.tile(0)[:8] * 3.0, b.block(0, 8))


def test_noise_tile_is_identical_in_another_process() -> None:
    """Retried / speculative tasks regenerate identical noise (spec 4.6 item 3)."""
    noise = _noise(tile=16, dim=5)
    code = (
        "import hashlib\n"
        "from pipeline.mechanisms.noise import GaussianNoise, NoiseCode, NoiseKey\n"
        "k = NoiseKey.insecure_from_seed(1).derive(int(NoiseCode.Z))\n"
        "n = GaussianNoise(key=k, sigma=2.5, length=45, dim=5, tile_size=16)\n"
        "print(hashlib.sha256(n.tile(2).tobytes()).hexdigest())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == hashlib.sha256(noise.tile(2).tobytes()).hexdigest()


def test_different_keys_and_tiles_give_different_noise() -> None:
    root = NoiseKey.insecure_from_seed(2)
    a = GaussianNoise(
        key=root.derive(int(NoiseCode.Y)), sigma=1.0, length=32, dim=4, tile_size=8
    )
    b = GaussianNoise(
        key=root.derive(int(NoiseCode.Z)), sigma=1.0, length=32, dim=4, tile_size=8
    )
    assert not np.array_equal(a.dense(), b.dense())
    assert not np.array_equal(a.tile(0), a.tile(1))


# ----------------------------------------------- noise is independent of the sketch seed


class _RecordingSource(ArraySource):
    """Records every released tall array (the noisy ``Y``) that the algorithm forms."""

    def __init__(self, A: np.ndarray) -> None:
        super().__init__(A)
        self.released: list[np.ndarray] = []

    def tall_noise_gram(self, Y, fn, op):  # type: ignore[no-untyped-def]
        out = super().tall_noise_gram(Y, fn, op)
        self.released.append(np.array(out[0]))
        return out


def _private_plan(shape: tuple[int, int]):  # type: ignore[no-untyped-def]
    return plan_lrf(
        LrfParams(
            algorithm=Algorithm.SPECTRAL,
            rank=2,
            sketch_size=6,
            core_size=20,
            epsilon=1.0,
            delta=1e-6,
            clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0),
        ),
        shape,
    )


def test_noise_does_not_depend_on_sketch_seed() -> None:
    """With A = 0 the released Y is pure noise: a function of the noise key only."""
    A = np.zeros((40, 30))
    plan = _private_plan(A.shape)
    key = NoiseKey.insecure_from_seed(9)
    ys = []
    for sketch_seed in (1, 2, 2**100 + 3):
        src = _RecordingSource(A)
        run_lrf(src, plan, ReleaseHooks(sketch_seed=sketch_seed, noise_key=key))
        ys.append(src.released[0])
    np.testing.assert_array_equal(ys[0], ys[1])
    np.testing.assert_array_equal(ys[0], ys[2])
    assert np.abs(ys[0]).max() > 0  # noise was actually added
    # a different key, same sketch seed: different noise
    src = _RecordingSource(A)
    run_lrf(
        src,
        plan,
        ReleaseHooks(sketch_seed=1, noise_key=NoiseKey.insecure_from_seed(10)),
    )
    assert not np.array_equal(src.released[0], ys[0])


def test_private_run_requires_a_separate_noise_key() -> None:
    plan = _private_plan((40, 30))
    with pytest.raises(InvalidParameterError, match="noise key"):
        run_lrf(
            ArraySource(np.zeros((40, 30))),
            plan,
            ReleaseHooks(sketch_seed=1, noise_key=None),
        )


def test_fresh_releases_with_one_sketch_seed_have_independent_noise() -> None:
    """T6: two releases, same sketch seed, fresh keys -> uncorrelated noise.

    |r| <= 4.5/sqrt(N) for independent noise; false-failure probability 7e-6 per
    run (fresh OS keys, so this is the one unseeded draw here, by design).
    """
    A = np.zeros((600, 300))
    plan = _private_plan(A.shape)
    ys = []
    for _ in range(2):
        src = _RecordingSource(A)
        run_lrf(src, plan, ReleaseHooks(sketch_seed=1, noise_key=NoiseKey.fresh()))
        ys.append(src.released[0].ravel())
    r = np.corrcoef(ys[0], ys[1])[0, 1]
    np.testing.assert_allclose(r, 0.0, rtol=0, atol=4.5 / np.sqrt(ys[0].size))


def test_derive_is_injective_on_label_tuples() -> None:
    """Distinct label tuples give distinct sub-keys (no separator ambiguity)."""
    key = NoiseKey.insecure_from_seed(7)
    subs = [key.derive(101, 3), key.derive("101/3"), key.derive(101), key.derive("101"), key.derive(1013)]
    assert len({s.secret for s in subs}) == len(subs)


@pytest.mark.parametrize("simd_first", [True, False])
def test_scalar_and_simd_chacha_draw_the_same_noise(
    monkeypatch: pytest.MonkeyPatch, simd_first: bool
) -> None:
    """The code path chosen by the speed probe never changes a draw: randomgen's
    SIMD and scalar ChaCha20 give one stream, which the noise relies on."""
    from pipeline.mechanisms import noise as noise_module

    noise = _noise(tile=16, dim=5)
    draws = {}
    for flag in (simd_first, not simd_first):
        monkeypatch.setattr(noise_module, "chacha_scalar_is_faster", lambda f=flag: not f)
        draws[flag] = (noise.block(3, 45), noise.tile(1))
        # the switch reached the generator (where the CPU has SIMD code at all)
        bits = noise_module._tile_generator(NoiseKey.insecure_from_seed(1), 0).bit_generator
        assert bits.use_simd == (flag and ChaCha(key=0).use_simd)
    np.testing.assert_array_equal(draws[True][0], draws[False][0])
    np.testing.assert_array_equal(draws[True][1], draws[False][1])
    # negative control: the comparison sees a one-tile shift
    assert not np.array_equal(noise.tile(1), noise.tile(2))
    # and at the source: both code paths of one key give the same keystream
    simd, scalar = ChaCha(key=7, rounds=20), ChaCha(key=7, rounds=20)
    if simd.use_simd:
        scalar.use_simd = False
        assert not scalar.use_simd
        np.testing.assert_array_equal(simd.random_raw(10_001), scalar.random_raw(10_001))


def test_simd_probe_is_measured_once_per_process() -> None:
    from pipeline.mechanisms.noise import chacha_scalar_is_faster

    first = chacha_scalar_is_faster()
    assert isinstance(first, bool)
    assert chacha_scalar_is_faster() is first
    assert chacha_scalar_is_faster.cache_info().hits >= 1
