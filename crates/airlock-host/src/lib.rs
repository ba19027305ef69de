//! airlock-host: the host-side job plumbing every backend shares (the runtime directory and
//! each job's directory in it, airlock's state directory, releasing `/out` through a
//! directory descriptor, how sandbox ids map to host ids), so that no
//! backend depends on another. It never imports a backend crate.
#![forbid(unsafe_code)]

pub mod error;
pub mod exits;
pub mod ids;
pub mod jobdir;
pub mod out;
mod state;
pub mod workspace;

pub use error::HostError;
pub use state::state_dir;
