//go:build tools

// Package tools pins the Kubernetes and etcd commands that the test harness (and the demo's
// kubectl) builds.
// The build tag keeps it out of every real build; `go mod tidy` still sees the imports,
// so the generated go.mod requires exactly the versions Kubernetes itself pins.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
