mod allowed;
mod clients;
mod common;
mod limits;
mod refused;
mod secrets;
mod tls;
