# A static, non-root image of sluice: nothing but the binary.
#
# The binary is built outside the image (no network is needed inside a
# build, and the same binary is the one the tests ran):
#
#   make image            # CGO_ENABLED=0 build into bin/linux-amd64/sluice, then docker build
#
# or by hand:
#
#   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath \
#     -ldflags "-s -w -X main.version=$(git describe --tags --always)" \
#     -o bin/linux-amd64/sluice ./cmd/sluice
#   docker build -t sluice:dev .
#
# The image runs as UID/GID 65532 (no name in a scratch image) and holds no
# shell, CA bundle or time zone data: sluice needs none of them (a rediss://
# store with a public CA would need a CA bundle mounted at
# /etc/ssl/certs/ca-certificates.crt). State (--data-dir) goes on a volume.
FROM scratch
ARG TARGETARCH=amd64
COPY bin/linux-${TARGETARCH}/sluice /sluice
USER 65532:65532
# Check API, /healthz, /readyz, /metrics; the admin API with --admin-listen;
# gossip (TCP and UDP) in multi-region mode.
EXPOSE 8080 8081 7946 7946/udp
ENTRYPOINT ["/sluice"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
