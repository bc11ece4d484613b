"""Zarr stores in S3-compatible object storage (``s3://bucket/key.zarr``).

Problem. On Kubernetes and in the cloud the inputs and the releases live in
object storage, which every worker reads directly. A URL is
opened as zarr's :class:`~zarr.storage.FsspecStore` over ``s3fs``; the
connection comes from the usual environment -- ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``), ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, ``AWS_REGION`` -- or from a JSON file of ``s3fs`` storage
options named by ``DPLR_STORAGE_OPTIONS``; never from the command line. No
credential is ever put in a message, a report, a journal or a ledger: every URL
dplr prints or records has its user-info redacted (:func:`redact`).

A URL is never a path: :func:`location` keeps it verbatim where ``os.path``
would make ``<cwd>/s3:/bucket/key`` of it, and makes a local path absolute.

Object storage has no atomic rename, so what needs one stays on a local or
shared filesystem: the privacy ledger, the release journals, the scratch
directory and the stream states (:func:`refuse_url`). A release written to a URL is published by its
last write, the root group's metadata carrying the report (one PUT, atomic):
until then a reader finds no report and refuses it as incomplete.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from pipeline.errors import InvalidParameterError, StoreLayoutError

__all__ = [
    "filesystem",
    "is_url",
    "local_path",
    "location",
    "open_store",
    "redact",
    "refuse_url",
    "storage_options",
    "url_exists",
    "url_fingerprint",
]

SCHEMES = ("s3://",)

#: ``scheme://rest`` anywhere in a text, up to the next whitespace.
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)(\S*)")
#: What every redacted user-info becomes.
REDACTED = "***"

#: Seconds to wait for a connection, and attempts, before an endpoint is called
#: unreachable (botocore's defaults wait 60 s per attempt, several times).
CONNECT_TIMEOUT = 5
MAX_ATTEMPTS = 2


def is_url(path: Any) -> bool:
    """True for an object-store URL (``s3://...``)."""
    return isinstance(path, str) and path.startswith(SCHEMES)


def _redact_one(match: re.Match[str]) -> str:
    scheme, rest = match.group(1), match.group(2)
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:  # user-info ends at the authority's last "@"
        cut = authority.rindex("@")
    elif ":" in authority and "@" in rest:
        # a password holding a raw "/", "?" or "#": over-redact to the last "@"
        cut = rest.rindex("@")
    else:
        return match.group(0)
    return f"{scheme}{REDACTED}{rest[cut:]}"


def redact(text: str) -> str:
    """``text`` with the user-info (``user:password@``) of every URL in it
    replaced by ``***@``.

    Every URL or endpoint that dplr prints or records (messages, reports,
    journal headers, ledgers) passes through here, so a credential written into
    ``AWS_ENDPOINT_URL`` or an ``s3://`` URL never leaves the process. A URL
    runs to the next whitespace; its user-info is what precedes the last ``@``
    of its authority, or, for an authority ``user:pa/ss@host`` (a raw ``/``,
    ``?`` or ``#`` in the password), what precedes the URL's last ``@``
    (redacting too much is harmless). Text without user-info is unchanged.

    Examples
    --------
    >>> redact("http://KEY:SECRET@host:9 cannot be reached")
    'http://***@host:9 cannot be reached'
    >>> redact("s3://bucket/a.zarr")
    's3://bucket/a.zarr'
    """
    return _URL.sub(_redact_one, text)


def location(path: str | os.PathLike[str]) -> str:
    """Where ``path`` points, as one comparable string.

    An object-store URL is kept verbatim (never passed to ``os.path``, which
    would turn ``s3://b/a.zarr`` into ``<cwd>/s3:/b/a.zarr``), without a
    trailing ``/``; a local path is made absolute. Pass the result through
    :func:`redact` before printing or recording it.

    Raises
    ------
    InvalidParameterError
        ``path`` is a URL of a scheme dplr does not read (only ``s3://``).
    """
    path = os.fspath(path)
    if is_url(path):
        return path.rstrip("/")
    if _URL.match(path):
        raise InvalidParameterError(
            f"{redact(path)!r}: only s3:// object storage is supported, or a local "
            "or shared path."
        )
    return os.path.abspath(path)


def local_path(path: str | os.PathLike[str], what: str, flag: str | None = None) -> str:
    """The absolute path of ``path``, which must not be a URL (:func:`refuse_url`)."""
    refuse_url(os.fspath(path), what, flag)
    return location(path)


def refuse_url(path: Any, what: str, flag: str | None = None) -> None:
    """Refuse an object-store URL where a local or shared path is needed."""
    if is_url(path):
        how = f"pass {flag} PATH" if flag else "use a local or shared path"
        raise InvalidParameterError(
            f"the {what} must be on a local or shared filesystem, not {redact(path)!r}: it "
            f"needs atomic writes, which object storage lacks; {how}."
        )


def storage_options() -> dict[str, Any]:
    """``s3fs`` options from ``DPLR_STORAGE_OPTIONS`` (a JSON file) and the
    environment's endpoint and region (credentials are read by botocore)."""
    opts: dict[str, Any] = {}
    path = os.environ.get("DPLR_STORAGE_OPTIONS")
    if path:
        try:
            with open(path) as fh:
                opts = json.load(fh)
        except (OSError, ValueError) as exc:
            raise InvalidParameterError(
                f"the storage-options file DPLR_STORAGE_OPTIONS={path!r} cannot be read "
                f"as JSON ({type(exc).__name__}); fix or unset it."
            ) from None
        if not isinstance(opts, dict):
            raise InvalidParameterError(
                f"the storage-options file {path!r} must hold a JSON object."
            )
    client = dict(opts.get("client_kwargs") or {})
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
        "AWS_ENDPOINT_URL"
    )
    if endpoint and "endpoint_url" not in opts:
        client.setdefault("endpoint_url", endpoint)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        client.setdefault("region_name", region)
    config = {
        "connect_timeout": CONNECT_TIMEOUT,
        "retries": {"max_attempts": MAX_ATTEMPTS},
    }
    config.update(opts.get("config_kwargs") or {})
    return {**opts, "client_kwargs": client, "config_kwargs": config}


def _endpoint(opts: dict[str, Any]) -> str:
    """The endpoint, as printed: its user-info redacted."""
    where = opts.get("endpoint_url") or opts["client_kwargs"].get("endpoint_url")
    return redact(str(where or "AWS S3"))


def filesystem() -> Any:
    """A synchronous ``s3fs.S3FileSystem`` with :func:`storage_options`."""
    import s3fs  # optional: s3fs, the object-store extra

    return s3fs.S3FileSystem(skip_instance_cache=True, **storage_options())


def _check_bucket(fs: Any, url: str, what: str, opts: dict[str, Any]) -> None:
    """One request to the bucket: a clear :class:`StoreLayoutError` if it fails."""
    bucket = url.split("://", 1)[1].split("/", 1)[0]
    shown = redact(url)
    named = shown.split("://", 1)[1].split("/", 1)[0]  # the bucket, as printed
    try:
        fs.info(bucket)
    except FileNotFoundError:
        raise StoreLayoutError(
            f"{what} {shown!r}: the bucket {named!r} does not exist at {_endpoint(opts)}; "
            "create it or check the URL and AWS_ENDPOINT_URL."
        ) from None
    except PermissionError:
        raise StoreLayoutError(
            f"{what} {shown!r}: access denied by {_endpoint(opts)}; check AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY (or the DPLR_STORAGE_OPTIONS file)."
        ) from None
    except Exception as exc:  # noqa: BLE001 - botocore/aiohttp raise many types
        raise StoreLayoutError(
            f"{what} {shown!r}: the object store at {_endpoint(opts)} cannot be reached "
            f"({type(exc).__name__}); check AWS_ENDPOINT_URL and the network."
        ) from None


def open_store(url: str, *, read_only: bool, what: str) -> Any:
    """zarr's ``FsspecStore`` for ``url``, after checking that its bucket answers."""
    from zarr.storage import FsspecStore  # heavy: zarr, kept off `dplr --help`

    opts = storage_options()
    _check_bucket(filesystem(), url, what, opts)
    return FsspecStore.from_url(url, storage_options=opts, read_only=read_only)


def url_exists(url: str, *, what: str) -> bool:
    """True if a Zarr node exists at ``url``: ``zarr.json`` (v3), or ``.zgroup``
    or ``.zarray`` (v2, as AnnData writes by default)."""
    fs = filesystem()
    _check_bucket(fs, url, what, storage_options())
    base = url.rstrip("/")
    return any(
        fs.exists(f"{base}/{key}") for key in ("zarr.json", ".zgroup", ".zarray")
    )


def remove_url(url: str) -> None:
    """Remove every object under ``url`` (an overwritten release)."""
    fs = filesystem()
    if fs.exists(url):
        fs.rm(url, recursive=True)


def url_fingerprint(url: str) -> str:
    """Names, sizes and ETags of the objects under ``url`` (metadata only)."""
    import hashlib  # heavy: hashlib loads OpenSSL (4 ms), kept off `dplr --help`

    h = hashlib.sha256()
    found = filesystem().find(url, detail=True)
    for name in sorted(found):
        info = found[name]
        rel = name[len(url.split("://", 1)[1]) :]
        h.update(f"{rel}\0{info.get('size')}\0{info.get('ETag')}\n".encode())
    return h.hexdigest()
