//! airlock-engine
