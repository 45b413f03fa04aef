// The real node's Pod sandbox ("pause") program: no dependencies.
module kustomize-operator/control-plane/pause

go 1.25.0
