"""The one place Chandy opens a file system (a local disk or an object store, through fsspec), and
the one table of storage settings: given once, under the names documented below, each part of the
stack gets them under its own names.

**Correctness never rests on a cached listing.** fsspec's object-store file systems (s3fs, adlfs,
gcsfs) cache directory listings and answer ``exists``/``info`` from them; a listing taken before
another process (a Spark task) wrote a file says that file does not exist. Every check that
decides what to commit, skip or delete (missing data files, unreferenced files, ``_metadata``,
savepoint pointers) goes through :func:`open_filesystem`, which turns the listings cache off
(``use_listings_cache=False``, fsspec's ``DirCache`` option), so each answer comes from the store
itself. fsspec still reuses one instance per set of options (its instance cache keys on them), so
the clients and their connection pools are not made again for every call.

**Settings** (``--storage-option NAME=VALUE``, or the environment variable of the same name; an
option wins over the environment). The documented names are those of delta-rs (the Rust
``object_store`` crate); :data:`SETTINGS` maps each to fsspec's backend and to pyiceberg:

=============================== ============================= ===========================
documented name                 fsspec (s3fs / adlfs / gcsfs)  pyiceberg FileIO
=============================== ============================= ===========================
``AWS_ACCESS_KEY_ID``           ``key``                       ``s3.access-key-id``
``AWS_SECRET_ACCESS_KEY``       ``secret``                    ``s3.secret-access-key``
``AWS_SESSION_TOKEN``           ``token``                     ``s3.session-token``
``AWS_REGION``                  ``client_kwargs.region_name`` ``s3.region``
``AWS_ENDPOINT_URL``            ``endpoint_url``              ``s3.endpoint``
``AWS_PROFILE``                 ``profile``                   (not read)
``AZURE_STORAGE_ACCOUNT_NAME``  ``account_name``              ``adls.account-name``
``AZURE_STORAGE_ACCOUNT_KEY``   ``account_key``               ``adls.account-key``
``AZURE_STORAGE_SAS_TOKEN``     ``sas_token``                 ``adls.sas-token``
``AZURE_STORAGE_CONNECTION_STRING`` ``connection_string``     ``adls.connection-string``
``GOOGLE_SERVICE_ACCOUNT``      ``token`` (a key file)        (not read)
=============================== ============================= ===========================

delta-rs reads every documented name as it is, but for ``AZURE_STORAGE_CONNECTION_STRING``, which
it gets as its parts (account name and key, SAS token, ``BlobEndpoint`` as ``AZURE_STORAGE_ENDPOINT``)
(plus its own, such as ``AWS_ALLOW_HTTP``,
``AWS_S3_ALLOW_UNSAFE_RENAME`` or ``AZURE_STORAGE_USE_EMULATOR``). Other names go to the one part
that spells them so: upper case or ``aws_``/``azure_``/``google_`` to delta-rs, names with a dot
(``s3.connect-timeout``) to pyiceberg, the rest (``anon``, ``requester_pays``) to fsspec.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import fsspec
from fsspec.core import split_protocol, url_to_fs

from chandy.schemas.errors import ChandyError

__all__ = [
    "BACKENDS",
    "SETTINGS",
    "Backend",
    "Setting",
    "StorageAccessError",
    "StorageBackendError",
    "delta_options",
    "describe_storage_error",
    "storage_error_cause",
    "fsspec_options",
    "is_local",
    "open_filesystem",
    "pyiceberg_properties",
    "require_backend",
    "resolve_settings",
    "to_url",
]


class StorageBackendError(ChandyError):
    """A URI's fsspec backend is not installed, or too old to be trusted."""


class StorageAccessError(ChandyError):
    """A store refused or could not be reached: missing bucket or container, wrong credentials,
    no permission, unreachable endpoint. The message names the URI and the reason."""


@dataclass(frozen=True)
class Backend:
    """The fsspec implementation of a URI scheme: its distribution, the oldest version trusted
    (older ones cache or sign differently; s3fs 0.4 resolves when pip backtracks), and the extra
    of ``chandy`` that pins it."""

    distribution: str
    minimum: tuple[int, ...]
    extra: str


#: URI scheme → the backend fsspec uses for it.
BACKENDS: dict[str, Backend] = {
    **dict.fromkeys(("s3", "s3a"), Backend("s3fs", (2024, 6), "s3")),
    **dict.fromkeys(("abfs", "abfss", "az", "adl"), Backend("adlfs", (2024, 4), "azure")),
    **dict.fromkeys(("gs", "gcs"), Backend("gcsfs", (2024, 6), "gcs")),
}


@dataclass(frozen=True)
class Setting:
    """One documented storage setting: its family (``s3``, ``azure``, ``gcs``) and its names in
    fsspec's backend (a dotted name goes into a nested dict: ``client_kwargs.region_name``) and in
    pyiceberg (None: not read there)."""

    family: str
    fsspec: str
    pyiceberg: str | None


SETTINGS: dict[str, Setting] = {
    "AWS_ACCESS_KEY_ID": Setting("s3", "key", "s3.access-key-id"),
    "AWS_SECRET_ACCESS_KEY": Setting("s3", "secret", "s3.secret-access-key"),
    "AWS_SESSION_TOKEN": Setting("s3", "token", "s3.session-token"),
    "AWS_REGION": Setting("s3", "client_kwargs.region_name", "s3.region"),
    "AWS_ENDPOINT_URL": Setting("s3", "endpoint_url", "s3.endpoint"),
    "AWS_PROFILE": Setting("s3", "profile", None),
    "AZURE_STORAGE_ACCOUNT_NAME": Setting("azure", "account_name", "adls.account-name"),
    "AZURE_STORAGE_ACCOUNT_KEY": Setting("azure", "account_key", "adls.account-key"),
    "AZURE_STORAGE_SAS_TOKEN": Setting("azure", "sas_token", "adls.sas-token"),
    "AZURE_STORAGE_CONNECTION_STRING": Setting("azure", "connection_string", "adls.connection-string"),
    "GOOGLE_SERVICE_ACCOUNT": Setting("gcs", "token", None),
}

_FAMILY = {"s3": "s3", "s3a": "s3", "abfs": "azure", "abfss": "azure", "az": "azure", "adl": "azure",
           "gs": "gcs", "gcs": "gcs"}


def _protocol(url: str) -> str:
    protocol, _ = split_protocol(url)
    return protocol or "file"


def _family(url: str) -> str | None:
    return _FAMILY.get(_protocol(url))


def _is_delta_name(name: str) -> bool:
    return name.isupper() or name.lower().startswith(("aws_", "azure_", "google_"))


def resolve_settings(storage_options: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The documented settings found in ``environ`` (default: ``os.environ``; ``AWS_DEFAULT_REGION``
    counts as ``AWS_REGION``), overlaid with ``storage_options`` (every name, as given)."""
    environ = os.environ if environ is None else environ
    found: dict[str, Any] = {name: environ[name] for name in SETTINGS if environ.get(name)}
    if "AWS_REGION" not in found and environ.get("AWS_DEFAULT_REGION"):
        found["AWS_REGION"] = environ["AWS_DEFAULT_REGION"]
    return {**found, **{k: str(v) if not isinstance(v, Mapping) else v for k, v in (storage_options or {}).items()}}


#: pyiceberg's ``client.*`` names, which its FileIO reads for every cloud when the family's own is unset
_PYICEBERG_ALIASES = {"client.access-key-id": "AWS_ACCESS_KEY_ID", "client.secret-access-key": "AWS_SECRET_ACCESS_KEY",
                      "client.session-token": "AWS_SESSION_TOKEN", "client.region": "AWS_REGION"}


def settings_from_pyiceberg(properties: Mapping[str, Any]) -> dict[str, str]:
    """The documented settings (:data:`SETTINGS`' names) that pyiceberg FileIO ``properties`` hold
    under pyiceberg's names (``s3.access-key-id``, ``client.region``, ...): what an Iceberg REST
    catalog vends with a table (the ``config`` of its load-table answer), in the names every other
    reader of storage settings here takes. A family's own name wins over pyiceberg's ``client.*``."""
    by_name = {setting.pyiceberg: name for name, setting in SETTINGS.items() if setting.pyiceberg}
    found = {_PYICEBERG_ALIASES[k]: str(v) for k, v in properties.items() if k in _PYICEBERG_ALIASES}
    found.update({by_name[k]: str(v) for k, v in properties.items() if k in by_name})
    return found


def fsspec_options(url: str, storage_options: Mapping[str, Any] | None = None,
                   environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """fsspec's keyword arguments for ``url``: the documented settings of its family under the
    backend's names, plus the options that are fsspec's own (lower case, no dot, no cloud
    prefix). A local path gets only the latter."""
    family = _family(url)
    options: dict[str, Any] = {}
    for name, value in resolve_settings(storage_options, environ).items():
        setting = SETTINGS.get(name)
        if setting is not None:
            if setting.family != family:
                continue
            head, _, tail = setting.fsspec.partition(".")
            if tail:
                options.setdefault(head, {})[tail] = value
            else:
                options[head] = value
        elif not _is_delta_name(name) and "." not in name:
            options[name] = value
    return options


def delta_options(url: str, storage_options: Mapping[str, Any] | None = None,
                  environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """delta-rs's ``storage_options`` for ``url``: the documented settings of its family and every
    delta-rs name given (upper case or cloud-prefixed), as strings; None when there are none."""
    family = _family(url)
    settings = resolve_settings(storage_options, environ)
    options = {name: str(value) for name, value in settings.items()
               if (name in SETTINGS and SETTINGS[name].family == family) or (name not in SETTINGS and _is_delta_name(name))}
    connection = options.pop("AZURE_STORAGE_CONNECTION_STRING", None)
    if connection:  # delta-rs reads no connection string: its parts, under delta-rs's names
        for name, value in _connection_string_settings(connection).items():
            options.setdefault(name, value)
    return options or None


def _connection_string_settings(connection: str) -> dict[str, str]:
    """delta-rs's settings from an Azure Storage connection string (``Key=Value;...``): account
    name and key, SAS token, and a ``BlobEndpoint`` (Azurite's ``http://127.0.0.1:10000/<account>``)
    as ``AZURE_STORAGE_ENDPOINT``, with ``AZURE_ALLOW_HTTP`` for an ``http`` one."""
    parts = dict(piece.split("=", 1) for piece in connection.split(";") if "=" in piece)
    mapped = {"AccountName": "AZURE_STORAGE_ACCOUNT_NAME", "AccountKey": "AZURE_STORAGE_ACCOUNT_KEY",
              "SharedAccessSignature": "AZURE_STORAGE_SAS_TOKEN", "BlobEndpoint": "AZURE_STORAGE_ENDPOINT"}
    settings = {mapped[key]: value for key, value in parts.items() if key in mapped and value}
    if settings.get("AZURE_STORAGE_ENDPOINT", "").startswith("http://"):
        settings["AZURE_ALLOW_HTTP"] = "true"
    return settings


def pyiceberg_properties(url: str | None, storage_options: Mapping[str, Any] | None = None,
                         environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """pyiceberg FileIO properties for a warehouse at ``url``: the documented settings of its
    family that pyiceberg reads, under its names, plus every dotted name given. ``url`` None (a
    catalog that says where its tables live): the settings of every family."""
    family = _family(url) if url else None
    props: dict[str, str] = {}
    for name, value in resolve_settings(storage_options, environ).items():
        setting = SETTINGS.get(name)
        if setting is not None and (family is None or setting.family == family) and setting.pyiceberg:
            props[setting.pyiceberg] = str(value)
        elif setting is None and "." in name:
            props[name] = str(value)
    return props


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def require_backend(url: str) -> None:
    """Refuse ``url`` when its fsspec backend is missing or older than trusted.

    Raises:
        StorageBackendError: one line naming the URI, what is missing (or the version found) and
            ``pip install 'chandy[<extra>]'``.
    """
    backend = BACKENDS.get(_protocol(url))
    if backend is None:
        return
    install = f"install it with: pip install 'chandy[{backend.extra}]'"
    try:
        found = metadata.version(backend.distribution)
    except metadata.PackageNotFoundError:
        raise StorageBackendError(f"{url}: its file system needs {backend.distribution}, which is not installed; "
                                  f"{install}") from None
    if _version(found) < backend.minimum:
        oldest = ".".join(map(str, backend.minimum))
        raise StorageBackendError(f"{url}: {backend.distribution} {found} is too old (at least {oldest} is needed); "
                                  f"{install}")


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` is a local disk (directories exist there; on object stores they do not)."""
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def to_url(fs: fsspec.AbstractFileSystem, path: str, like: str | None = None) -> str:
    """``path`` of ``fs`` as a URL in the scheme of ``like`` (the URL the user gave) when that
    scheme is another name of the same backend: fsspec spells a backend's URLs with its first
    protocol (adlfs: ``abfs://`` for a directory given as ``az://``), and a pointer should read
    as the directory it is in."""
    url = fs.unstrip_protocol(path)
    scheme = like.split("://", 1)[0] if like and "://" in like else None
    if scheme and "://" in url and not is_local(fs) and url.split("://", 1)[0] != scheme:
        url = f"{scheme}://{url.split('://', 1)[1]}"
    return url


def open_filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """``(file system, path)`` for ``url``, whose every answer comes from the store (no listings
    cache). ``storage_options`` as
    :func:`fsspec_options` reads them.

    Raises:
        StorageBackendError: the backend is missing or too old (:func:`require_backend`).
    """
    require_backend(url)
    options = fsspec_options(url, storage_options)
    if _protocol(url) not in ("file", "local"):
        options.setdefault("use_listings_cache", False)
    return url_to_fs(url, **options)


_CAUSES = (
    (("nosuchbucket", "bucket does not exist", "containernotfound", "container does not exist"),
     "the bucket or container does not exist"),
    (("invalidaccesskeyid", "signaturedoesnotmatch", "invalidclienttokenid", "authenticationfailed",
      "failed to authenticate",
      "access key id you provided does not exist", "request signature we calculated does not match",
      "security token included in the request is invalid", "credentials"),
     "the credentials are missing or were refused"),
    (("accessdenied", "access denied", "forbidden", "authorizationpermissionmismatch", "not authorized"),
     "permission denied"),
    (("could not connect", "connection refused", "endpointconnectionerror", "failed to establish",
      "cannot connect", "connect timeout", "name or service not known", "dns error", "connection error",
      "error sending request"),
     "the endpoint is unreachable"),
)


#: the store's own error code: S3's and Azure's XML ``<Code>``, azure-core's ``ErrorCode:``
_ERROR_CODE = re.compile(r"<Code>(\w+)</Code>|ErrorCode:(\w+)")


def storage_error_cause(exc: BaseException) -> str:
    """What went wrong in a storage failure, in one line: the cause when it is recognised (missing
    bucket or container, refused credentials, no permission, unreachable endpoint) followed by the
    underlying message in parentheses (the first line of the innermost exception, and the
    store's own error code), else that message alone."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    text = " ".join(f"{type(e).__name__} {e}" for e in chain).lower()
    reason: str | None
    if isinstance(exc, PermissionError) and "credential" not in text and "signature" not in text \
            and "access key" not in text:
        reason = "permission denied"
    else:
        reason = next((cause for needles, cause in _CAUSES if any(n in text for n in needles)), None)
    detail = str(chain[-1]).strip().splitlines()[0] if str(chain[-1]).strip() else type(chain[-1]).__name__
    code = _ERROR_CODE.search(" ".join(str(e) for e in chain))
    if code is not None and (code.group(1) or code.group(2)) not in detail:
        detail = f"{detail}: {code.group(1) or code.group(2)}"
    return f"{reason} ({detail})" if reason else detail


def describe_storage_error(url: str, exc: BaseException) -> str:
    """One line for a storage failure at ``url``: ``<url>: <cause>`` (see :func:`storage_error_cause`)."""
    return f"{url}: {storage_error_cause(exc)}"
