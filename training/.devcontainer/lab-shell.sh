# Sourced by every interactive shell of the training container: points
# kubectl at the project's local control plane (KUBECONFIG, and the pinned
# kubectl first on PATH) and puts the pinned helm and the operator built by
# `cargo build` on PATH.
ko_workspace="${KO_WORKSPACE:-/workspaces/kustomize-operator}"
ko_control_plane="$ko_workspace/hack/control-plane/control-plane"
if [ -x "$ko_control_plane" ]; then
  if ko_env="$("$ko_control_plane" env 2>/dev/null)"; then
    eval "$ko_env"
  else
    PATH="$("$ko_control_plane" bin-dir):$PATH"
    echo "The local control plane is not running; start it with:" >&2
    echo "  eval \"\$(hack/control-plane/control-plane up)\"" >&2
  fi
  # helm for lab 05, once built (postCreateCommand: hack/helm/helm build).
  if ko_helm="$("$ko_workspace/hack/helm/helm" path 2>/dev/null)"; then
    PATH="${ko_helm%/helm}:$PATH"
  fi
  PATH="$ko_workspace/target/debug:$PATH"
  export PATH
fi
unset ko_workspace ko_control_plane ko_env ko_helm
