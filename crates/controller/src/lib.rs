//! The Tessera topology-aware controller.
