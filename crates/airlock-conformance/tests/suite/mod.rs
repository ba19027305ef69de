#[macro_use]
pub mod common;
mod basics;
mod budgets;
mod cleanup;
mod doctor;
mod floods;
mod hostile;
mod images;
mod limits;
mod out;
mod probe;
mod proxy;
mod sessions;
mod tls;
