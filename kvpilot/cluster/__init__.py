"""A real local Kubernetes control plane (etcd, kube-apiserver, KWOK) for tests and demos."""
