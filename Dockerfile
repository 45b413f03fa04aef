# syntax=docker/dockerfile:1
# The kustomize-operator image: the release binary, kubectl at the version the
# tests use, and the kustomize/ bases and templates; non-root, no shell, and
# fine with a read-only root filesystem (everything it writes goes to /tmp,
# an emptyDir in deploy/).
#
#   docker build -t kustomize-operator:dev .
#
# builds everything from source in the golang and rust stages below, on the
# distroless runtime. hack/image builds this same file with podman where no
# registry is reachable: the binaries built beforehand (BINARIES=prebuilt,
# from .prebuilt/ in the build context) on a base assembled from Debian
# packages (RUNTIME_IMAGE=localhost/kustomize-operator-base:<hash>).

# Base images; override them to use a mirror or a local base.
ARG GOLANG_IMAGE=golang:1.26-bookworm
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
# Where the two binaries come from: `source` (the kubectl and build stages)
# or `prebuilt` (.prebuilt/kubectl and .prebuilt/kustomize-operator in the
# build context). Only the stages the choice needs are built.
ARG BINARIES=source

# kubectl, static, from the wrapper module that pins k8s.io/kubernetes for
# the local control plane's newest supported minor
# (hack/control-plane/kubernetes/<minor>: go.mod + go.sum): the image
# carries exactly the kubectl the tests run, from checksummed sources, with
# no download other than Go modules. hack/build-kubectl holds the recipe
# (CGO off, version stamped); hack/image runs the same script.
FROM ${GOLANG_IMAGE} AS kubectl
ARG KUBERNETES_MINOR=1.37
WORKDIR /src
COPY hack/build-kubectl /usr/local/bin/build-kubectl
COPY hack/control-plane/kubernetes/${KUBERNETES_MINOR}/ ./
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    build-kubectl . /out/kubectl

# The operator, release build. Only the manifests, the lock file and the
# sources are copied, so edits elsewhere do not invalidate this stage (the
# tests' helpers, tests/support, are a workspace member: cargo reads their
# manifest but builds none of their code here).
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY tests/support/Cargo.toml tests/support/
COPY src/ src/
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin kustomize-operator \
 && mkdir -p /out \
 && cp target/release/kustomize-operator /out/

# The two binaries, built above...
FROM scratch AS binaries-source
COPY --from=kubectl /out/kubectl /kubectl
COPY --from=build /out/kustomize-operator /kustomize-operator

# ...or built beforehand, the same way (hack/image), and put in the context.
FROM scratch AS binaries-prebuilt
COPY .prebuilt/kubectl .prebuilt/kustomize-operator /

# (A stage, not an image: hadolint cannot tell with the variable.)
# hadolint ignore=DL3006
FROM binaries-${BINARIES} AS binaries

# Runtime: glibc, libgcc and CA certificates only, no shell, UID 65532.
FROM ${RUNTIME_IMAGE}
COPY --from=binaries /kubectl /usr/local/bin/kubectl
COPY --from=binaries /kustomize-operator /usr/local/bin/kustomize-operator
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
