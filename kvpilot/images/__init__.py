"""Daemonless container images: a Debian root filesystem by mmdebstrap, assembled by crane.

`python -m kvpilot.images operator engine` (`make images`); see images/README.md.
"""
