#[macro_use]
pub mod common;
mod basics;
mod cleanup;
mod doctor;
mod floods;
mod images;
mod limits;
mod out;
mod probe;
mod proxy;
