"""Model URIs the storage initializer fetches: oci://, s3:// and hf://."""

from __future__ import annotations

import re
from dataclasses import dataclass

REMOTE_SCHEMES = ("oci", "s3", "hf")
FORMS = ("oci://<registry>/<repository>[:<tag>|@sha256:<digest>], s3://<bucket>[/<prefix>] "
         "or hf://<owner>/<repo>[@<revision>]")

# The CRD's spec.model.uri rule is MOUNTED_PATTERN | these three, without the group names (CRD_URI_PATTERN;
# tests/unit/test_model_delivery_crd.py keeps them equal). No backslashes: the rule is a CEL string literal.
_OCI_TEXT = (r"oci://(?P<registry>[a-zA-Z0-9.-]+(:[0-9]+)?)/(?P<repository>[a-z0-9]+(([._]|__|-+|/)[a-z0-9]+)*)"
             r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})|@(?P<digest>sha256:[a-f0-9]{64}))?")
_S3_TEXT = r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/(?P<prefix>[^?#]*))?"
_HF_TEXT = r"hf://(?P<repo>[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*)(@(?P<revision>[-A-Za-z0-9_./]+))?"
MOUNTED_PATTERN = "pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/.*)?|file:///.*|/.*"
CRD_URI_PATTERN = "^(" + "|".join([MOUNTED_PATTERN, *(re.sub(r"\?P<\w+>", "", t) for t in (_OCI_TEXT, _S3_TEXT, _HF_TEXT))]) + ")$"
_OCI, _S3, _HF = (re.compile(t) for t in (_OCI_TEXT, _S3_TEXT, _HF_TEXT))


class BadModelUri(ValueError):
    """A model URI that names no source the storage initializer can fetch."""


@dataclass(frozen=True)
class OciRef:
    registry: str
    repository: str
    reference: str  # a tag or sha256:<hex>


@dataclass(frozen=True)
class S3Ref:
    bucket: str
    prefix: str  # "" or ending in "/"


@dataclass(frozen=True)
class HfRef:
    repo_id: str
    revision: str


ModelRef = OciRef | S3Ref | HfRef


def scheme(uri: str) -> str:
    return uri.partition("://")[0] if "://" in uri else ""


def is_remote(uri: str) -> bool:
    """A URI the storage initializer fetches (as opposed to a volume the pod mounts: pvc://, file://, /)."""
    return scheme(uri) in REMOTE_SCHEMES


def parse(uri: str) -> ModelRef:
    if m := _OCI.fullmatch(uri):
        return OciRef(m["registry"], m["repository"], m["digest"] or m["tag"] or "latest")
    if m := _S3.fullmatch(uri):
        prefix = (m["prefix"] or "").strip("/")
        return S3Ref(m["bucket"], f"{prefix}/" if prefix else "")
    if m := _HF.fullmatch(uri):
        return HfRef(m["repo"], m["revision"] or "main")
    raise BadModelUri(f"model uri {uri!r} is not one the storage initializer fetches: use {FORMS}")
