// Command pause is the real node's Pod sandbox: the first process of every
// Pod, holding its namespaces while the Pod's containers come and go, as
// Kubernetes' own pause image does. It waits for SIGINT or SIGTERM and
// exits 0, reaping the orphans a shared PID namespace hands it meanwhile.
//
// The control-plane script builds it static and packs it into a one-layer
// OCI image, imported into the node's containerd: no registry is needed.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (kustomize-operator control plane)")
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "warning: pause should be the first process")
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
