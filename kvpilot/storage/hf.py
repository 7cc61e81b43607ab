"""hf://: a Hugging Face Hub repository (or a mirror: spec.model.endpoint, or HF_ENDPOINT), fetched
by huggingface_hub's own snapshot_download, so its resolve/redirect/ETag handling is the Hub's.

Only the served files at the repository's root are fetched (the suffixes the digest covers), not
the other formats many repositories also carry (*.bin, *.gguf, original/*.pth).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from kvpilot.checkpoint_digest import SERVED_SUFFIXES
from kvpilot.storage.credentials import Credentials
from kvpilot.storage.fetch import FetchError, FetchStats
from kvpilot.storage.uri import HfRef

ALLOW = [f"*{suffix}" for suffix in SERVED_SUFFIXES]
IGNORE = ["*/*"]  # fnmatch's * crosses '/': this leaves out every file in a subfolder


class HfFetcher:
    """One repository at one revision."""

    def __init__(self, ref: HfRef, credentials: Credentials, endpoint: str | None = None) -> None:
        self.ref = ref
        self.token = credentials.get("HF_TOKEN")
        self.endpoint = endpoint or None  # None: huggingface_hub's HF_ENDPOINT or the Hub

    @property
    def name(self) -> str:
        return f"hf://{self.ref.repo_id}@{self.ref.revision}"

    def fetch(self, dest: Path) -> FetchStats:
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # an init container's log is read by people: one line per outcome
        try:
            snapshot_download(self.ref.repo_id, revision=self.ref.revision, local_dir=dest, allow_patterns=ALLOW,
                              ignore_patterns=IGNORE, endpoint=self.endpoint, token=self.token)
        except Exception as exc:  # the library's errors (not found, gated, refused, offline) share no base
            raise FetchError(f"{self.name}: {type(exc).__name__}: {_first_line(exc)}") from None
        shutil.rmtree(dest / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping of local_dir
        stats = FetchStats()
        for path in dest.iterdir():
            if path.is_file():
                stats.add(path.stat().st_size)
        if stats.files == 0:
            raise FetchError(f"{self.name}: the repository has no served files (*.safetensors, *.json, ...)")
        return stats

    def read_config(self) -> bytes:
        from huggingface_hub import hf_hub_download

        with tempfile.TemporaryDirectory(prefix="kvpilot-hf-") as tmp:
            try:
                path = hf_hub_download(self.ref.repo_id, "config.json", revision=self.ref.revision, cache_dir=tmp,
                                       endpoint=self.endpoint, token=self.token)
            except Exception as exc:  # as in fetch
                raise FetchError(f"{self.name}: config.json: {type(exc).__name__}: {_first_line(exc)}") from None
            return Path(path).read_bytes()


HINTS = {"RepositoryNotFoundError": "check the owner/repo, and HF_TOKEN in the credentials Secret for a private repo",
         "GatedRepoError": "the repository is gated: accept its terms with the account whose HF_TOKEN the Secret holds",
         "RevisionNotFoundError": "check the @revision (a branch, tag or commit of the repository)",
         "EntryNotFoundError": "the repository has no such file at this revision"}


def _first_line(exc: Exception) -> str:
    """The library's message on one line, and what to check."""
    text = " ".join(str(exc).split())[:400] or "(no message)"
    hint = HINTS.get(type(exc).__name__)
    return f"{text}; {hint}" if hint else text
