//! Golden manifests: what `airlock kube install` applies (`deploy/namespace/`) and an
//! example job Pod (`deploy/examples/job-pod.yaml`), rendered from the code. CI validates
//! them with `kubernetes-validate --strict` for the oldest supported version. Set
//! `AIRLOCK_BLESS=1` to rewrite them after an intended change.
