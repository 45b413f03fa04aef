//go:build tools

// Package tools records the command this wrapper module builds, so that
// `go mod tidy` keeps its dependencies in go.sum.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
