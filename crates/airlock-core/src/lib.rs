//! airlock-core owns airlock's model: the job request and its checked form, the policy
//! file, the observation, bounded output capture, the audit record, the [`Backend`] trait,
//! and the supervision core every backend runs a job through ([`supervise`]: output caps,
//! the flood limit, the tap, the wall-time deadline and the kill decision), and the warm
//! pool every backend's warm sandboxes are kept in ([`warm`]). It opens
//! nothing and has no unsafe code: the supervision core reads only the streams a backend
//! hands it; everything that touches the OS lives in the backend crates, and everything
//! that writes files lives in the engine.
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
pub mod request;
pub mod schema;
pub mod supervise;
pub mod units;
pub mod warm;

pub use backend::{
    Backend, BackendError, BackendKind, BoxFuture, Capabilities, OpenOptions, OutputTap, Provider,
    StreamKind, Teardown, WarmPoolStats,
};
pub use error::{Error, ErrorKind};
pub use job::{InputFile, JobId, JobRequest, JobSpec, LimitsRequest, NetworkRequest};
pub use observation::{
    Acquire, JobResult, LimitHit, Observation, Outcome, RejectedFile, ReleasedFile, RunReport,
    Termination,
};
pub use policy::{Limits, Policy};
pub use units::{ByteSize, Cpus};
