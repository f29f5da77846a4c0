//! Test tooling (never shipped): Tessera's first-fit allocator against the upstream structured
//! allocator driven as kube-scheduler drives it (`tests/parity`, Go) and against an independent
//! reference allocator ([`reference`]), on generated instances and on replays of upstream's own
//! unit test cases; and side-by-side benchmarks of Tessera and upstream.
//!
//! ```text
//! tests/parity/build                          # the Go side, cached; prints its path
//! tessera-parity diff --oracle BIN --count 3000 --seed 1
//! tessera-parity bench --oracle BIN --out DIR  # side by side, interleaved
//! ```
//!
//! See tests/parity/README.md.
//!
//! Modules: `instance` (one generated allocation problem), `generate`, `cel` (the selectors the
//! generator writes), `ours` (Tessera's verdict), `oracle` (upstream's, through the Go tool),
//! `reference` (the independent first-fit allocator), `compare` (two verdicts side by side),
//! `judge` (which differences fail the job, and the least coverage per outcome), `canary` (a
//! deliberately wrong Tessera the job must fail), `bench`.

pub mod bench;
pub mod canary;
pub mod cel;
pub mod compare;
pub mod generate;
pub mod instance;
pub mod judge;
pub mod oracle;
pub mod ours;
pub mod reference;
