"""Storage settings given once reach each part under its own names; a missing or too old backend
is refused naming its extra; storage errors name their cause; no answer comes from a cached
listing (issue 34). Pure logic, without a store."""

from __future__ import annotations

from unittest import mock

import pytest

from chandy.coordinator import filesystems
from chandy.coordinator.filesystems import (
    StorageBackendError,
    delta_options,
    describe_storage_error,
    fsspec_options,
    open_filesystem,
    pyiceberg_properties,
    require_backend,
)

GIVEN = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "eu-west-1",
         "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true", "requester_pays": "true",
         "s3.connect-timeout": "10"}


def test_s3_settings_reach_s3fs_delta_rs_and_pyiceberg_under_their_names() -> None:
    assert fsspec_options("s3://b/t", GIVEN, environ={}) == {
        "key": "AK", "secret": "SK", "client_kwargs": {"region_name": "eu-west-1"},
        "endpoint_url": "http://127.0.0.1:9000", "requester_pays": "true"}
    assert delta_options("s3://b/t", GIVEN, environ={}) == {
        "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true"}
    assert pyiceberg_properties("s3://b/w", GIVEN, environ={}) == {
        "s3.access-key-id": "AK", "s3.secret-access-key": "SK", "s3.region": "eu-west-1",
        "s3.endpoint": "http://127.0.0.1:9000", "s3.connect-timeout": "10"}


def test_the_environment_counts_and_an_option_wins_over_it() -> None:
    environ = {"AWS_ACCESS_KEY_ID": "from-env", "AWS_DEFAULT_REGION": "us-west-2", "AWS_ENDPOINT_URL": "http://e"}
    options = fsspec_options("s3://b/t", {"AWS_ACCESS_KEY_ID": "given"}, environ=environ)
    assert options == {"key": "given", "client_kwargs": {"region_name": "us-west-2"}, "endpoint_url": "http://e"}


def test_azure_settings_go_to_adlfs_and_pyiceberg_and_not_to_an_s3_table() -> None:
    given = {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "key", "AWS_REGION": "x"}
    assert fsspec_options("abfs://c/t", given, environ={}) == {"account_name": "acct", "account_key": "key"}
    assert pyiceberg_properties("abfs://c/w", given, environ={}) == {"adls.account-name": "acct",
                                                                      "adls.account-key": "key"}
    assert fsspec_options("s3://b/t", given, environ={}) == {"client_kwargs": {"region_name": "x"}}
    assert fsspec_options("/tmp/t", given, environ={}) == {}  # a local disk takes no cloud settings
    assert delta_options("/tmp/t", given, environ={}) is None


def test_a_missing_or_old_backend_is_refused_naming_its_extra() -> None:
    with mock.patch.object(filesystems.metadata, "version", side_effect=filesystems.metadata.PackageNotFoundError):
        with pytest.raises(StorageBackendError, match=r"s3://b/t: .*needs s3fs, which is not installed; .*chandy\[s3\]"):
            require_backend("s3://b/t")
    with mock.patch.object(filesystems.metadata, "version", return_value="0.4.2"):
        with pytest.raises(StorageBackendError, match=r"s3fs 0.4.2 is too old .*chandy\[s3\]"):
            require_backend("s3://b/t")
        with pytest.raises(StorageBackendError, match=r"adlfs 0.4.2 is too old .*chandy\[azure\]"):
            require_backend("abfss://c@a.dfs.core.windows.net/t")
    require_backend("/tmp/t")  # a local disk needs nothing


def test_an_object_store_is_opened_without_a_listings_cache() -> None:
    fs, path = open_filesystem("memory://bucket/table")
    assert path == "/bucket/table"  # memory is local-like: fsspec's defaults kept
    with mock.patch.object(filesystems, "url_to_fs", return_value=(fs, "b/t")) as opened:
        open_filesystem("s3://b/t", {"AWS_ACCESS_KEY_ID": "AK"})
    kwargs = opened.call_args.kwargs
    assert kwargs["use_listings_cache"] is False and kwargs["key"] == "AK"


@pytest.mark.parametrize(("error", "cause"), [
    (FileNotFoundError("The specified bucket does not exist"), "the bucket or container does not exist"),
    (PermissionError("The AWS Access Key Id you provided does not exist in our records."),
     "the credentials are missing or were refused"),
    (PermissionError("Access Denied"), "permission denied"),
    (OSError("Could not connect to the endpoint URL: http://127.0.0.1:1/b"), "the endpoint is unreachable"),
])
def test_storage_errors_name_their_cause_and_the_uri(error: BaseException, cause: str) -> None:
    line = describe_storage_error("s3://b/t", error)
    assert line.startswith(f"s3://b/t: {cause} (") and "\n" not in line


def test_a_delta_rs_azure_error_names_the_cause_and_the_store_code() -> None:
    error = OSError("Generic MicrosoftAzure error\n  Error performing list request\n   403 Forbidden\n"
                    "<Error><Code>AuthorizationFailure</Code><Message>Server failed to authenticate the request."
                    "</Message></Error>")
    assert describe_storage_error("az://c/t", error) == (
        "az://c/t: the credentials are missing or were refused (Generic MicrosoftAzure error: AuthorizationFailure)")


def test_the_cause_is_found_down_the_exception_chain() -> None:
    try:
        try:
            raise OSError("Generic S3 error: NoSuchBucket")
        except OSError as inner:
            raise RuntimeError("cannot open table") from inner
    except RuntimeError as outer:
        assert describe_storage_error("s3://x/t", outer) == (
            "s3://x/t: the bucket or container does not exist (Generic S3 error: NoSuchBucket)")


def test_a_url_keeps_the_scheme_the_user_gave_for_the_same_backend() -> None:
    """adlfs spells its URLs abfs://; a savepoint under a directory given as az:// reads az://."""
    from fsspec.implementations.memory import MemoryFileSystem

    from chandy.coordinator.filesystems import to_url

    class Adl(MemoryFileSystem):
        protocol = ("abfs", "az", "abfss")
        root_marker = ""

    fs = Adl()
    assert to_url(fs, "c/checkpoints/savepoint-1", like="az://c/checkpoints") == "az://c/checkpoints/savepoint-1"
    assert to_url(fs, "c/checkpoints/savepoint-1", like="abfs://c/checkpoints") == "abfs://c/checkpoints/savepoint-1"
    assert to_url(fs, "c/checkpoints/savepoint-1") == "abfs://c/checkpoints/savepoint-1"
