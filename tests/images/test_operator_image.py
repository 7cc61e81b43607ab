"""The operator image, built daemonless (mmdebstrap + crane) as CI builds it, then run with chroot
in its unpacked layers: `kvpilot operator --help`, no torch, non-root, the package version."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kvpilot
from kvpilot.images.build import BuiltImage, build_image, require_tools, run_in, unpack
from kvpilot.images.spec import image_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> tuple[BuiltImage, Path, dict]:  # type: ignore[no-untyped-def]
    try:
        require_tools()
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise  # CI must build the image (.ci/run installs mmdebstrap, make builds crane)
        pytest.skip(str(exc))
    built = build_image(image_spec("operator"), tmp_path_factory.mktemp("images"))
    root = tmp_path_factory.mktemp("rootfs")
    config = unpack(built.tarball, root)
    print(f"\noperator image: {built.tarball.stat().st_size / 1e6:.0f} MB tarball, root filesystem "
          f"{built.rootfs_bytes / 1e6:.0f} MB, built in {built.seconds:.0f} s")
    return built, root, config["config"]


def test_kvpilot_operator_help_runs_in_the_unpacked_image(image) -> None:  # type: ignore[no-untyped-def]
    _, root, config = image
    result = run_in(root, config, [*config["Entrypoint"], "operator", "--help"])
    assert result.returncode == 0, result.stderr
    assert "--all-namespaces" in result.stdout and "--peering" in result.stdout


def test_the_operator_image_has_no_torch_and_says_which_extra_serve_needs(image) -> None:  # type: ignore[no-untyped-def]
    _, root, config = image
    probe = run_in(root, config, ["python3", "-c", "import importlib.util as u, kopf, kubernetes, "
                                  "kvpilot.operator.handlers; print(u.find_spec('torch') is None)"])
    assert probe.returncode == 0 and probe.stdout.strip() == "True", probe.stderr
    serve = run_in(root, config, ["kvpilot", "serve", "--model", "/tmp/none"])
    assert serve.returncode == 2 and "pip install 'kvpilot[engine]'" in serve.stderr, serve.stderr


def test_the_image_runs_as_non_root_with_the_package_version(image) -> None:  # type: ignore[no-untyped-def]
    built, root, config = image
    assert config["User"] == "65532:65532" and config["Entrypoint"] == ["kvpilot"]
    assert config["Labels"]["org.opencontainers.image.version"] == kvpilot.__version__
    assert built.tarball.name == f"kvpilot-operator-{kvpilot.__version__}.tar"
    whoami = run_in(root, config, ["id", "-u"])
    assert whoami.stdout.strip() == "65532"
