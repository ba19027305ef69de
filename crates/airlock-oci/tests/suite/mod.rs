pub mod common;
mod concurrency;
mod e2e;
mod hostile;
mod registry;
mod store;
