# syntax=docker/dockerfile:1
# Placeholder until the in-cluster issue lands: builds the operator binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/kustomize-operator /usr/local/bin/kustomize-operator
COPY kustomize /kustomize
ENV KUSTOMIZE_DIR=/kustomize
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kustomize-operator"]
CMD ["run"]
