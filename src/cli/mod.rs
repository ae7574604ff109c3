//! The command-line tools beside the server, built on the library as any client would be:
//!
//! - [`import`]: `fanline import`, a resumable bulk load of a CSV file of points
//! - [`bench`](mod@bench): `fanline bench`, the timeline and series benchmarks

pub mod bench;
pub mod import;
