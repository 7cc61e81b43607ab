"""Model delivery's pure parts: URIs, SigV4 against AWS's published examples, credentials, the node cache."""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kvpilot.checkpoint_digest import checkpoint_digest
from kvpilot.storage import sigv4
from kvpilot.storage.cache import MARKER, DigestRefused, cache_key, ensure
from kvpilot.storage.credentials import BadCredentials, Credentials
from kvpilot.storage.fetch import FetchError, FetchStats, safe_path
from kvpilot.storage.uri import BadModelUri, HfRef, OciRef, S3Ref, parse

pytestmark = pytest.mark.unit


def test_uris_parse_and_bad_ones_name_the_forms() -> None:
    assert parse("oci://127.0.0.1:5000/models/tiny:v1") == OciRef("127.0.0.1:5000", "models/tiny", "v1")
    assert parse("oci://ghcr.io/org/m") == OciRef("ghcr.io", "org/m", "latest")
    digest = "sha256:" + "a" * 64
    assert parse(f"oci://r.io/m@{digest}").reference == digest
    assert parse("s3://bucket/models/llama/") == S3Ref("bucket", "models/llama/")
    assert parse("s3://bucket") == S3Ref("bucket", "")
    assert parse("hf://Qwen/Qwen2-7B@v1.0") == HfRef("Qwen/Qwen2-7B", "v1.0")
    assert parse("hf://org/repo").revision == "main"
    for bad in ("oci://registry-only", "s3://B", "hf://no-owner", "http://x/y", "oci://r.io/UPPER:v1"):
        with pytest.raises(BadModelUri, match="oci://<registry>/<repository>"):
            parse(bad)


AWS = {"access_key": "AKIAIOSFODNN7EXAMPLE", "secret_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
       "region": "us-east-1", "now": datetime(2013, 5, 24, tzinfo=UTC)}


def test_sigv4_matches_aws_published_examples() -> None:
    """The S3 SigV4 documentation's 'GET Object' and 'GET Bucket (List Objects)' examples."""
    get = sigv4.sign("GET", "examplebucket.s3.amazonaws.com", "/test.txt", {}, {"Range": "bytes=0-9"}, **AWS)
    assert get["Authorization"].endswith(
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    listing = sigv4.sign("GET", "examplebucket.s3.amazonaws.com", "/", {"max-keys": "2", "prefix": "J"}, {}, **AWS)
    assert listing["Authorization"].endswith("Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")
    token = sigv4.sign("GET", "h", "/", {}, {}, session_token="tok", **AWS)
    assert token["x-amz-security-token"] == "tok" and "x-amz-security-token" in token["Authorization"]


def test_credentials_from_a_mounted_secret_and_from_the_api(tmp_path: Path) -> None:
    docker = json.dumps({"auths": {"https://reg.example:5000/v1/": {"auth": base64.b64encode(b"bob:pw").decode()}}})
    (tmp_path / ".dockerconfigjson").write_text(docker)
    (tmp_path / "HF_TOKEN").write_text("hf_abc\n")
    (tmp_path / "..data").mkdir()  # the kubelet's own entries are not keys
    creds = Credentials.from_dir(tmp_path)
    assert creds.get("HF_TOKEN") == "hf_abc" and creds.registry_login("reg.example:5000") == ("bob", "pw")
    assert creds.registry_login("other.io") is None
    secret = {"data": {"AWS_ACCESS_KEY_ID": base64.b64encode(b"AK\n").decode(),
                       "username": base64.b64encode(b"u").decode(), "password": base64.b64encode(b"p").decode()}}
    api = Credentials.from_secret(secret)
    assert api.get("AWS_ACCESS_KEY_ID") == "AK" and api.registry_login("any") == ("u", "p")
    with pytest.raises(BadCredentials, match="docker config JSON"):
        Credentials({".dockerconfigjson": "not json"}).registry_login("x")
    with pytest.raises(BadCredentials, match="is the Secret mounted"):
        Credentials.from_dir(tmp_path / "missing")


def test_safe_path_refuses_escapes(tmp_path: Path) -> None:
    assert safe_path(tmp_path, "a/b.json", "t") == tmp_path / "a" / "b.json"
    for bad in ("../x", "/etc/passwd", "a/../../x", ""):
        with pytest.raises(FetchError, match="relative path"):
            safe_path(tmp_path, bad, "t")


def _writer(files: dict[str, bytes], calls: list[int], delay: float = 0.0):
    def fetch(dest: Path) -> FetchStats:
        calls.append(1)
        time.sleep(delay)
        stats = FetchStats()
        for name, data in files.items():
            (dest / name).write_bytes(data)
            stats.add(len(data))
        return stats
    return fetch


FILES = {"config.json": b"{}", "model.safetensors": b"w" * 1000, "tokenizer.json": b"{}",
         "chat_template.jinja": b"{{ x }}"}


def _digest(tmp_path: Path, files: dict[str, bytes]) -> str:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for name, data in files.items():
        (src / name).write_bytes(data)
    return checkpoint_digest(src)


def test_cache_second_fetch_downloads_nothing_and_waiters_share_one_fetch(tmp_path: Path) -> None:
    digest = _digest(tmp_path, FILES)
    dest = tmp_path / "cache" / cache_key(digest)
    calls: list[int] = []
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(
        ensure(dest, "oci://r/m:v1", digest, _writer(FILES, calls, delay=0.3)))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(calls) == 1  # the lock: the others waited, then found it complete
    assert sorted(o.hit for o in outcomes) == [False, True, True]
    assert sum(o.stats.bytes for o in outcomes) == sum(len(v) for v in FILES.values())
    assert checkpoint_digest(dest) == digest and (dest / MARKER).is_file()
    again = ensure(dest, "oci://r/m:v1", digest, _writer(FILES, calls))
    assert again.hit and again.stats.bytes == 0 and len(calls) == 1
    assert not list(dest.parent.glob(".*.partial-*"))


@pytest.mark.parametrize("swapped", ["tokenizer.json", "chat_template.jinja", "config.json", "model.safetensors"])
def test_a_mismatch_caches_nothing_and_says_what_to_check(tmp_path: Path, swapped: str) -> None:
    digest = _digest(tmp_path, FILES)
    dest = tmp_path / "cache" / cache_key(digest)
    tampered = {**FILES, swapped: b"something else"}
    with pytest.raises(DigestRefused) as caught:
        ensure(dest, "s3://b/m/", digest, _writer(tampered, []))
    message = str(caught.value)
    assert digest in message and "spec.model.sha256" in message and "kvpilot digest" in message
    assert not dest.exists() and not list(dest.parent.glob(".*.partial-*"))


def test_a_killed_fetch_leaves_a_partial_that_the_next_one_clears(tmp_path: Path) -> None:
    digest = _digest(tmp_path, FILES)
    dest = tmp_path / "cache" / cache_key(digest)
    dest.parent.mkdir(parents=True)
    (dest.parent / f".{dest.name}.partial-999999").mkdir()
    (dest.parent / f".{dest.name}.partial-999999" / "model.safetensors").write_bytes(b"half")

    def broken(path: Path) -> FetchStats:
        raise FetchError("connection reset")

    with pytest.raises(FetchError):
        ensure(dest, "hf://o/r", digest, broken)
    assert not dest.exists() and not list(dest.parent.glob(".*.partial-*"))
    assert not ensure(dest, "hf://o/r", digest, _writer(FILES, [])).hit


def test_an_unwritable_cache_says_whose_uid_must_write_it(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(PermissionError, match="writable by the pod's user"):
        ensure(blocked / "sha256-x", "hf://o/r", None, _writer(FILES, []))
