//! airlock-kube: the Kubernetes backend. One implementation of [`airlock_core::Backend`]
//! runs each job in exactly one hardened Pod (restricted Pod Security profile, no service
//! account token, no host namespaces, uid 65534, every capability dropped, read-only root,
//! requests equal to limits, the image by digest) with at most two API writes per job
//! (create, delete): the inputs travel in the Pod's own annotations, the Pod is watched
//! rather than polled, its log is followed with `limitBytes`, and it is deleted after every
//! job; a janitor removes airlock's Pods past their deadline. It also holds the objects
//! `airlock kube install` creates once per namespace and the `doctor` checks. It must never
//! touch a Pod without the `airlock.managed=true` label, never mount a host path or a
//! token into a job, and never weaken a control the policy has not accepted.
#![forbid(unsafe_code)]

pub mod backend;
pub mod doctor;
pub mod error;
pub mod host_checks;
pub mod install;
pub mod launch;
pub mod pod;
pub mod provider;
pub mod pss;
pub mod status;
pub mod supervise;
pub mod sweep;
pub mod teardown;
pub mod yaml;

pub use backend::{KubeBackend, open};
pub use error::KubeError;
pub use provider::KubeProvider;
