# syntax=docker/dockerfile:1
# The kustomize-operator image: the release binary, kubectl at the version the
# tests use, and the kustomize/ bases and templates; non-root, distroless, and
# fine with a read-only root filesystem (everything it writes goes to /tmp,
# an emptyDir in deploy/).
#
#   docker build -t kustomize-operator:dev .
#
# No container engine runs where this project is developed and tested, so CI
# lints this file (hadolint, and tests/dockerfile.rs) but does not build it.

# kubectl, built from the wrapper module that pins k8s.io/kubernetes for the
# local control plane (hack/control-plane/kubernetes: go.mod + go.sum), so the
# image carries exactly the kubectl the tests run, from checksummed sources,
# with no download other than Go modules. Static (CGO off): it runs on any base.
FROM golang:1.25-bookworm AS kubectl
WORKDIR /src
COPY hack/control-plane/kubernetes/ ./
ENV CGO_ENABLED=0
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' go.mod)" \
 && test -n "$version" \
 && minor="${version#v1.}" && minor="${minor%%.*}" \
 && ldflags="-s -w" \
 && for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do \
      ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"; \
    done \
 && go build -trimpath -ldflags "$ldflags" -o /out/kubectl k8s.io/kubernetes/cmd/kubectl \
 && /out/kubectl version --client

# The operator, release build. Only the manifest, the lock file and the
# sources are copied, so edits elsewhere do not invalidate this stage.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src/ src/
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin kustomize-operator \
 && mkdir -p /out \
 && cp target/release/kustomize-operator /out/

# Runtime: glibc and libgcc only (distroless cc), no shell, UID 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=kubectl /out/kubectl /usr/local/bin/kubectl
COPY --from=build /out/kustomize-operator /usr/local/bin/kustomize-operator
COPY kustomize/ /etc/kustomize-operator/kustomize/
# Overlays, kubectl's cache and anything kubectl writes under $HOME go to /tmp.
ENV KUSTOMIZE_DIR=/etc/kustomize-operator/kustomize \
    KUBECTL=/usr/local/bin/kubectl \
    WORK_DIR=/tmp/kustomize-operator \
    HOME=/tmp \
    METRICS_ADDR=0.0.0.0:8080
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kustomize-operator"]
CMD ["run"]
