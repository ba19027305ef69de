mod common;
mod golden;
mod objects;
mod protocol;
mod status;
mod wrapper;
