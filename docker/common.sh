# shellcheck shell=bash
# Sourced by docker/test.sh and docker/test-deb.sh: a running dockerd, and a Debian bookworm base
# image. Expects `work` (a scratch directory) to be set; sets `docker` and `base`.
# shellcheck disable=SC2154  # work: the sourcing script's
docker=/usr/bin/docker  # Debian's docker.io client

# Starts dockerd if none answers.
ensure_dockerd() {
  if ! "$docker" info >/dev/null 2>&1; then
    echo "$(basename "$0"): starting dockerd"
    (nohup /usr/sbin/dockerd >/tmp/orochi-dockerd.log 2>&1 &)
    for _ in $(seq 1 60); do "$docker" info >/dev/null 2>&1 && break; sleep 0.5; done
    "$docker" info >/dev/null 2>&1 || { cat /tmp/orochi-dockerd.log >&2; exit 1; }
  fi
}

# OROCHI_DOCKER_BASE (default debian:bookworm-slim) where present or pullable; otherwise
# orochi-base:bookworm, made once with debootstrap from the archive apt is configured with (no
# registry is named here: the mirror is the machine's own), slimmed as bookworm-slim is. Its
# apt sources are that same mirror, so containers from it install packages with apt-get.
ensure_base() {
  base=${OROCHI_DOCKER_BASE:-debian:bookworm-slim}
  if ! "$docker" image inspect "$base" >/dev/null 2>&1 && ! "$docker" pull "$base" >/dev/null 2>&1; then
    base=orochi-base:bookworm
    if ! "$docker" image inspect "$base" >/dev/null 2>&1; then
      local mirror
      # shellcheck disable=SC2016  # apt's own $(...) fields, not the shell's
      mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' | awk '$2 == "bookworm" {print $1; exit}')
      echo "$(basename "$0"): no base image; debootstrap from $mirror"
      debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
        { tail -20 "$work/debootstrap.log" >&2; exit 1; }
      # What debian:bookworm-slim leaves out too: documentation, manuals, translations, caches.
      rm -rf "$work/rootfs"/var/cache/apt/* "$work/rootfs"/var/lib/apt/lists/* \
        "$work/rootfs"/usr/share/doc/* "$work/rootfs"/usr/share/man/* "$work/rootfs"/usr/share/info/* \
        "$work/rootfs"/usr/share/locale/*
      tar -C "$work/rootfs" -c . | "$docker" import - "$base" >/dev/null
      rm -rf "$work/rootfs"
    fi
  fi
}
