//! airlock-native
