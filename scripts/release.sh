#!/usr/bin/env bash
# Builds the release binaries of postbox VERSION into dist/: static
# (CGO_ENABLED=0), reproducible (-trimpath, no VCS stamp, fixed -ldflags
# holding only the commit and its time), for every platform postbox ships
# on, with a SHA256SUMS file beside them.
#
#   scripts/release.sh [--debug] [--allow-dirty] [--out DIR] [--targets "OS/ARCH ..."] VERSION
#
# VERSION must be the version the source declares
# (internal/buildinfo.Version), without the tag's "v": 0.1.0 for the tag
# v0.1.0. Two runs on the same commit with the same Go give the same
# bytes, so anyone can check a published sum by building it again.
#
#   --debug        keep the DWARF debug data and the symbol table
#                  (-s -w are left out): about 19 MB more per binary, for
#                  a debugger; stack traces and profiles do not need them.
#   --allow-dirty  build a tree with uncommitted changes (the commit then
#                  reads COMMIT-dirty); a release refuses them.
#   --out DIR      where the binaries go (default dist); its postbox-*
#                  and SHA256SUMS are replaced.
#   --targets      the platforms to build (default: all of them below).
set -euo pipefail

usage() {
  sed -n 7p "$0" | sed 's/^#   /usage: /' >&2
  exit 2
}
die() {
  echo "release.sh: $*" >&2
  exit 1
}

all_targets="linux/amd64 linux/arm64 linux/arm/v7 darwin/arm64"
targets=$all_targets
debug=false allow_dirty=false out=dist version=""
while [ $# -gt 0 ]; do
  case $1 in
    --debug) debug=true ;;
    --allow-dirty) allow_dirty=true ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift ;;
    --targets) [ $# -ge 2 ] || die "--targets needs a list such as \"linux/amd64 darwin/arm64\""; targets=$2; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "release.sh: unknown flag $1" >&2; usage ;;
    *) [ -z "$version" ] || { echo "release.sh: one VERSION only, got $version and $1" >&2; usage; }; version=$1 ;;
  esac
  shift
done
[ -n "$version" ] || { echo "release.sh: no VERSION given" >&2; usage; }

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

declared=$(sed -n 's/^const Version = "\(.*\)"$/\1/p' internal/buildinfo/buildinfo.go)
[ -n "$declared" ] || die "internal/buildinfo/buildinfo.go declares no const Version"
if [ "$version" != "$declared" ]; then
  die "VERSION $version is not the version the source declares ($declared in internal/buildinfo/buildinfo.go): bump it there and in CHANGELOG.md first"
fi
grep -q "^## $version - " CHANGELOG.md || die "CHANGELOG.md has no section \"## $version - YYYY-MM-DD\""

commit=$(git rev-parse HEAD 2>/dev/null) || die "not a git checkout: the binaries must name their commit"
# The committer time of the commit, in UTC: the same on every machine.
built=$(TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD)
if [ -n "$(git status --porcelain)" ]; then
  $allow_dirty || die "the tree has uncommitted changes (git status): commit them, or pass --allow-dirty for a build that is not a release"
  commit=$commit-dirty
fi

ldflags="-X github.com/postbox-events/postbox/internal/buildinfo.commit=$commit -X github.com/postbox-events/postbox/internal/buildinfo.buildTime=$built"
$debug || ldflags="-s -w $ldflags"

for target in $targets; do
  case " $all_targets " in
    *" $target "*) ;;
    *) die "unknown target $target: want some of $all_targets" ;;
  esac
done

# Only this script's files are removed from --out, never the rest of it.
mkdir -p "$out"
rm -f "$out"/postbox-* "$out/SHA256SUMS"
for target in $targets; do
  IFS=/ read -r goos goarch variant <<<"$target"
  goarm=""
  [ "$variant" = v7 ] && goarm=7
  name=postbox-$version-$goos-$goarch${variant}
  echo "release.sh: $name" >&2
  # Only what is set here decides the bytes: a GOFLAGS, GOAMD64 or
  # GOARM64 of the environment is overridden.
  env CGO_ENABLED=0 GOOS="$goos" GOARCH="$goarch" GOARM="$goarm" GOAMD64=v1 GOARM64=v8.0 GOFLAGS= \
    go build -trimpath -buildvcs=false -ldflags="$ldflags" -o "$out/$name" ./cmd/postbox
done
(cd "$out" && sha256sum postbox-* >SHA256SUMS)
cat "$out/SHA256SUMS"
