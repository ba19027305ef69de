mod common;
mod e2e;
mod fake;
mod golden;
mod objects;
mod protocol;
mod status;
mod wrapper;
