//! airlock-oci's integration tests, one binary (`tests/suite/`).
mod suite;
