//! airlock-core owns airlock's model: the job request and its checked form, the policy
//! file, the observation, bounded output capture, the audit record and the [`Backend`]
//! trait. It does no I/O and has no unsafe code; everything that touches the OS lives in
//! the backend crates, and everything that writes files lives in the engine.
#![forbid(unsafe_code)]

pub mod audit;
pub mod backend;
pub mod capture;
pub mod doctor;
pub mod error;
pub mod job;
pub mod media;
pub mod observation;
pub mod policy;
pub mod schema;
pub mod units;

pub use backend::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, OutputTap, StreamKind,
    WarmPoolStats,
};
pub use error::{Error, ErrorKind};
pub use job::{InputFile, JobId, JobRequest, JobSpec, LimitsRequest, NetworkRequest};
pub use observation::{
    JobResult, LimitHit, Observation, Outcome, RejectedFile, ReleasedFile, RunReport, Termination,
};
pub use policy::{Limits, Policy};
pub use units::{ByteSize, Cpus};
