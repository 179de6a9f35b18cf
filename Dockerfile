# postbox serve in a container: one static binary on Alpine, running as
# appuser (uid 10001) with its database on the volume /data.
#
#   docker build -t postbox .
#   docker run -p 8000:8000 -v postbox-data:/data -e POSTBOX_API_TOKEN=TOKEN postbox
#
# PORT=8000 makes serve listen on every interface of the container, so it
# refuses to start without an API token (POSTBOX_API_TOKEN), unless
# POSTBOX_INSECURE_NO_API_TOKEN=true says to serve the operator API open.
# Neither is set here: the choice is the one running the image's.

FROM golang:1.26-alpine AS build
WORKDIR /src
# Modules first, so that a change to the code does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The SQLite driver is pure Go (modernc.org/sqlite): no cgo, no libc.
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/postbox ./cmd/postbox

FROM alpine:3.22
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
