//! Structured-parameters device allocation with upstream semantics plus topology scoring. No IO.
