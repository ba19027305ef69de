mod common;
mod config;
mod corpus;
mod hostile;
mod properties;
mod rules;
mod stream;
