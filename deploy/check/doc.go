// Package check holds the offline checks of decodeplane's deployment
// artifacts (deploy/kubernetes, deploy/container, deploy/systemd): a module
// of its own so that the daemon's go.mod never pulls Kubernetes.
//
// Its tests render every kustomize overlay in-process with kustomize's API
// (sigs.k8s.io/kustomize/api v0.21.2, the one kustomize v5.8.2 ships),
// decode every object strictly (client-go v0.37.2's scheme: an unknown or
// duplicated field is an error; the Prometheus Operator's ServiceMonitor
// into a local struct, strictly too), assert the deployment invariants
// (gRPC readiness probe, non-root, read-only root file system, grace period
// ≥ server.shutdown_timeout + the preStop drain, ports equal to the
// ConfigMap's listen addresses, selectors that match) and run the real
// `decodeplane validate`, built from the repository, on every ConfigMap with
// the container's environment, and run each overlay's termination (the
// daemon serving the ConfigMap, the preStop drain, SIGTERM; the etcd
// overlay's daemon joined to a real etcd, decodeplane-dev-etcd). The etcd
// overlay must also advertise the pod's IP and keep etcd's TLS and password
// in mounted Secrets, and a pod missing one of them is refused naming the
// key. They parse the
// Dockerfile, the .dockerignore and the systemd unit, run `systemd-analyze
// verify` where it exists, and trace `decodeplane serve` with strace (where
// it exists) to check every system call against the unit's
// SystemCallFilter. Run them with
// `make deploy-check` (Go only, no cluster, no Docker, no network beyond the
// module proxy).
package check
