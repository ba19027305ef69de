#[macro_use]
pub mod common;
mod basics;
mod budgets;
mod cleanup;
mod doctor;
mod images;
mod limits;
mod out;
mod probe;
mod proxy;
