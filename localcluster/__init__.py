"""Local Kubernetes control plane and (later) node agent for tests, benchmarks and the demo.

Not part of the shipped `supervisor` package: it runs real etcd / kube-apiserver /
kube-controller-manager / kube-scheduler binaries built by build-binaries.sh on loopback.
"""
