//! The DRA CEL environment: device variable, quantity and semver libraries, compile cache, cost guard. No IO.
