mod build;
pub mod common;
mod concurrency;
mod e2e;
mod hostile;
mod import;
mod registry;
mod store;
