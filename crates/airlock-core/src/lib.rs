//! airlock-core
