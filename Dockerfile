# postbox serve in a container: one static binary on Alpine, running as
# appuser (uid 10001) with its database on the volume /data.
#
#   docker build -t postbox --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ) .
#   docker run -p 8000:8000 -v postbox-data:/data -e POSTBOX_API_TOKEN=TOKEN postbox
#
# Both platforms at once, cross-compiled on the build machine's own
# platform (no emulation: the binary is pure Go):
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t postbox --build-arg VERSION=0.1.0 .
#
# postbox version, /health and postbox_build_info say the source's version
# (internal/buildinfo.Version) in every build; VERSION only labels the
# image and should be that. REVISION and CREATED fill the OCI labels and
# are the commit and time postbox version shows (the build context has no
# .git).
#
# PORT=8000 makes serve listen on every interface of the container, so it
# refuses to start without an API token (POSTBOX_API_TOKEN), unless
# POSTBOX_INSECURE_NO_API_TOKEN=true says to serve the operator API open.
# Neither is set here: the choice is the one running the image's.

FROM --platform=$BUILDPLATFORM golang:1.26-alpine AS build
ARG TARGETOS TARGETARCH
ARG VERSION="" REVISION="" CREATED=""
WORKDIR /src
# Modules first, so that a change to the code does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The SQLite driver is pure Go (modernc.org/sqlite): no cgo, no libc.
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
    -ldflags="-s -w -X github.com/postbox-events/postbox/internal/buildinfo.commit=$REVISION -X github.com/postbox-events/postbox/internal/buildinfo.buildTime=$CREATED" \
    -o /out/postbox ./cmd/postbox

FROM alpine:3.22
ARG VERSION="" REVISION="" CREATED=""
LABEL org.opencontainers.image.title="postbox" \
      org.opencontainers.image.description="Moves events from where they happen to the code that handles them, without losing one and without handling one twice" \
      org.opencontainers.image.source="https://github.com/postbox-events/postbox" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.created="$CREATED"
# A fixed uid and gid, so that a volume or a bind mount can be owned by
# them on the host. /data is created and owned before VOLUME declares it:
# a new named volume starts as a copy of it, owned by appuser.
RUN addgroup -S -g 10001 appuser \
    && adduser -S -D -H -u 10001 -G appuser -h /data appuser \
    && mkdir /data \
    && chown appuser:appuser /data
COPY --from=build /out/postbox /usr/local/bin/postbox
ENV DB_PATH=/data/events.db PORT=8000
VOLUME /data
EXPOSE 8000
USER appuser
# No HEALTHCHECK: postbox has no command that probes a server, and a
# wget of http://127.0.0.1:8000/ready would be wrong as soon as --addr or
# --tls-cert change. Probe GET /ready from the orchestrator instead.
ENTRYPOINT ["postbox"]
CMD ["serve"]
