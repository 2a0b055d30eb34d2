#!/bin/sh
# CI only: build a local stand-in for python:3.11-slim-bookworm where no image registry is
# reachable. Debian bookworm (minbase) + python3 + python3-venv, fetched by debootstrap from the
# Debian mirror apt on this machine already uses, imported with `buildah bud` (FROM scratch + ADD).
# Usage: images/ci/make-base.sh IMAGE_NAME
# Storage settings (vfs driver, storage root) come from the environment, e.g. CONTAINERS_STORAGE_CONF.
set -eu
name=${1:?usage: make-base.sh IMAGE_NAME}
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list.d/debian.sources ]; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || { echo "make-base.sh: no Debian mirror found; set DEBIAN_MIRROR" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! debootstrap --variant=minbase --include=python3,python3-venv bookworm "$work/rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1; then
  tail -n 20 "$work/debootstrap.log" >&2
  exit 1
fi
# Package caches are not part of an image; device nodes and /proc come from the runtime.
rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
tar -C "$work/rootfs" --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* -cf "$work/rootfs.tar" .
printf 'FROM scratch\nADD rootfs.tar /\nCMD ["python3"]\n' >"$work/Containerfile"
buildah bud --isolation chroot --file "$work/Containerfile" --tag "$name" "$work"
